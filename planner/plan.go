package planner

import (
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"

	"github.com/meshbuild/meshbuild/mesh"
)

// Plan is what a trigger asks to be built: an immutable value. Its slices
// are the plan's own (copied from the trigger and the catalogue); treat them
// as read-only. Marshalled to JSON it is deterministic: the same catalogue
// and trigger give the same bytes.
type Plan struct {
	// ID is PlanID(Trigger).
	ID      string  `json:"id"`
	Trigger Trigger `json:"trigger"`
	// Modules are the plan's nodes sorted by (tier, name).
	Modules []Node `json:"modules"`
	// Tiers are the module names of each tier, sorted: Tiers[k] are the
	// modules of tier k.
	Tiers [][]string `json:"tiers"`
	// External are the bases outside the plan that plan modules are built
	// on, sorted by module: they stay at their current digest.
	External []External `json:"external,omitempty"`
}

// Node is one module of a plan.
type Node struct {
	Module string `json:"module"`
	// Tier is the node's longest path from a node with no in-plan base:
	// 0 when it has none.
	Tier int `json:"tier"`
	// On are all the module's bases (build.on, deduplicated, as declared).
	On []string `json:"on,omitempty"`
	// InPlanBases are the bases in the plan, sorted: the node is built
	// after them, pinned to the digests they are built at.
	InPlanBases []string `json:"in_plan_bases,omitempty"`
	// Dependents are the plan's nodes built directly on this one, sorted.
	Dependents []string `json:"dependents,omitempty"`
	// Reason says, for a human, why the module is in the plan.
	Reason string `json:"reason"`
	Source Source `json:"source"`
}

// Source is where and how a node is built: the manifest's build section
// with the commit the plan builds.
type Source struct {
	// Repo is build.repo as the manifest spells it (to clone from).
	Repo string `json:"repo"`
	// Commit is the trigger's commit for a module of the triggering
	// repository; empty means "the module's current commit", which the
	// caller resolves before asking.
	Commit string `json:"commit,omitempty"`
	// Path is build.path, the build context in the repository.
	Path string `json:"path,omitempty"`
	// Dockerfile is relative to Path, defaulted.
	Dockerfile string `json:"dockerfile"`
	// Platforms are build.platforms, defaulted.
	Platforms []string `json:"platforms"`
	// NoProvenance and NoSBOM are build.provenance: false and build.sbom:
	// false.
	NoProvenance bool `json:"no_provenance,omitempty"`
	NoSBOM       bool `json:"no_sbom,omitempty"`
	// Compression is build.compression as the ask carries it
	// (mesh.Build.AskCompression): empty for gzip.
	Compression string `json:"compression,omitempty"`
}

// Mesh returns the source as the build ask carries it.
func (s Source) Mesh() mesh.Source {
	return mesh.Source{Repo: s.Repo, Commit: s.Commit, Path: s.Path, Dockerfile: s.Dockerfile,
		NoProvenance: s.NoProvenance, NoSBOM: s.NoSBOM, Compression: s.Compression}
}

// External is a base outside the plan, kept at its current digest.
type External struct {
	Module string `json:"module"`
	// NeededBy are the plan's modules built on it, sorted.
	NeededBy []string `json:"needed_by"`
}

// Empty reports whether the plan builds nothing.
func (p Plan) Empty() bool { return len(p.Modules) == 0 }

// Node returns the plan's node for a module.
func (p Plan) Node(module string) (Node, bool) {
	for _, n := range p.Modules {
		if n.Module == module {
			return n, true
		}
	}
	return Node{}, false
}

// Names returns the plan's module names in plan order (tier, name).
func (p Plan) Names() []string {
	out := make([]string, len(p.Modules))
	for i, n := range p.Modules {
		out[i] = n.Module
	}
	return out
}

// New plans a trigger against a catalogue. For many plans against one
// catalogue, make an Index once and call its Plan.
func New(c *mesh.Catalogue, t Trigger) (Plan, error) {
	return NewIndex(c).Plan(t)
}

// Reasons a module is in a plan.
const (
	reasonRebuild = "asked for by rebuild"
)

// Plan plans a trigger: the modules it selects and everything built on them.
// A trigger that selects nothing gives an empty plan and no error. Errors
// wrap ErrTrigger, ErrUnknownModule, ErrNotBuilt or ErrCycle.
//
// It works in four named steps: select the trigger's seeds, close them
// downstream through build.on, order the closure into tiers, and lay the
// plan's nodes out in (tier, name) order.
func (ix *Index) Plan(t Trigger) (Plan, error) {
	if err := t.Validate(); err != nil {
		return Plan{}, err
	}
	t = copyTrigger(t)
	reason, seeds, err := ix.selectSeeds(t)
	if err != nil {
		return Plan{}, err
	}
	in, members := ix.downstream(seeds)
	tier, err := ix.tiers(members, in)
	if err != nil {
		return Plan{}, err
	}
	return ix.layout(t, members, in, tier, reason), nil
}

// selectSeeds picks the modules a trigger names itself: for a push, the
// modules built from its repository (under its changed paths); for a
// rebuild, the modules it lists. reason[i] says why module i was picked
// ("" unless it was).
func (ix *Index) selectSeeds(t Trigger) (reason []string, seeds []int32, err error) {
	reason = make([]string, len(ix.names))
	switch t.Kind {
	case KindPush:
		repo := NormaliseRepo(t.Repo)
		paths := cleanPaths(t.Paths)
		for _, i := range ix.byRepo[repo] {
			if len(paths) == 0 {
				reason[i] = ix.builtFrom(i)
			} else if r, ok := ix.matchPaths(i, paths); ok {
				reason[i] = r
			} else {
				continue
			}
			seeds = append(seeds, i)
		}
	case KindRebuild:
		var unknown, notBuilt []string
		for _, name := range t.Modules {
			i, ok := ix.pos[name]
			switch {
			case ok:
				if reason[i] == "" {
					reason[i] = reasonRebuild
					seeds = append(seeds, i)
				}
			case ix.known[name]:
				notBuilt = append(notBuilt, name)
			default:
				unknown = append(unknown, name)
			}
		}
		if len(unknown) > 0 {
			return nil, nil, fmt.Errorf("%w: %s not in the catalogue (list the catalogue's modules with: builds catalogue show)",
				ErrUnknownModule, quoteList(unknown))
		}
		if len(notBuilt) > 0 {
			return nil, nil, fmt.Errorf("%w: %s has no build section, so there is nothing to rebuild (rebuild a module with build: in its manifest)",
				ErrNotBuilt, quoteList(notBuilt))
		}
	}
	return reason, seeds, nil
}

// downstream closes the seeds under "built on": in[i] reports whether
// module i is in the plan, and members lists the plan's modules in name
// order.
func (ix *Index) downstream(seeds []int32) (in []bool, members []int32) {
	in = make([]bool, len(ix.names))
	members = make([]int32, 0, len(seeds))
	for _, s := range seeds {
		if !in[s] {
			in[s] = true
			members = append(members, s)
		}
	}
	for k := 0; k < len(members); k++ {
		for _, d := range ix.deps[members[k]] {
			if !in[d] {
				in[d] = true
				members = append(members, d)
			}
		}
	}
	slices.Sort(members) // name order
	return in, members
}

// tiers gives each member its longest path from a member with no in-plan
// base, walking the plan's subgraph in mesh.Topo's order; a cycle is
// refused (ErrCycle), printed.
func (ix *Index) tiers(members []int32, in []bool) ([]int, error) {
	local := make([]int32, len(ix.names)) // catalogue index → index in members
	for k, m := range members {
		local[m] = int32(k)
	}
	edges := func(adj [][]int32) func(int) iter.Seq[int] {
		return func(k int) iter.Seq[int] {
			return func(yield func(int) bool) {
				for _, j := range adj[members[k]] {
					if in[j] && !yield(int(local[j])) {
						return
					}
				}
			}
		}
	}
	order, cyclic := mesh.Topo(len(members), edges(ix.bases), edges(ix.deps))
	if len(cyclic) > 0 {
		left := make([]bool, len(ix.names))
		for _, k := range cyclic {
			left[members[k]] = true
		}
		return nil, ix.cycleError(members, left)
	}
	tier := make([]int, len(ix.names))
	for _, k := range order {
		m := members[k]
		for _, b := range ix.bases[m] {
			if in[b] {
				tier[m] = max(tier[m], tier[b]+1)
			}
		}
	}
	return tier, nil
}

// layout builds the plan value: nodes in (tier, name) order, each with its
// bases, dependents, source and reason, and the bases outside the plan.
func (ix *Index) layout(t Trigger, members []int32, in []bool, tier []int, reason []string) Plan {
	// Plan order (tier, name) by counting sort: members are in name order.
	maxTier := 0
	for _, m := range members {
		maxTier = max(maxTier, tier[m])
	}
	p := Plan{ID: PlanID(t), Trigger: t, Modules: make([]Node, 0, len(members)), Tiers: make([][]string, maxTier+1)}
	if len(members) == 0 {
		p.Tiers = [][]string{}
	}
	order, bound := tierOrder(members, tier, maxTier)

	// One backing array for every node's string slices.
	size := len(members) // tier lists
	for _, m := range members {
		size += 2*len(ix.on[m]) + len(ix.deps[m]) + len(ix.man[m].Build.PlatformsOrDefault())
	}
	arena := make([]string, 0, size)
	carve := func(from int) []string { return arena[from:len(arena):len(arena)] }
	for k := range p.Tiers {
		from := len(arena)
		for _, m := range order[bound[k]:bound[k+1]] {
			arena = append(arena, ix.names[m])
		}
		p.Tiers[k] = carve(from)
	}

	ext := map[string][]string{}
	for _, m := range order {
		nd := Node{Module: ix.names[m], Tier: tier[m], Source: ix.source(m, t)}
		from := len(arena)
		arena = append(arena, ix.on[m]...)
		nd.On = nilIfEmpty(carve(from))
		from = len(arena)
		for _, b := range ix.bases[m] {
			if in[b] {
				arena = append(arena, ix.names[b])
			}
		}
		nd.InPlanBases = nilIfEmpty(carve(from))
		from = len(arena)
		for _, d := range ix.deps[m] {
			if in[d] {
				arena = append(arena, ix.names[d])
			}
		}
		nd.Dependents = nilIfEmpty(carve(from))
		from = len(arena)
		arena = append(arena, ix.man[m].Build.PlatformsOrDefault()...)
		nd.Source.Platforms = carve(from)
		for _, b := range ix.on[m] {
			if j, ok := ix.pos[b]; !ok || !in[j] {
				ext[b] = append(ext[b], nd.Module)
			}
		}
		nd.Reason = reason[m]
		if nd.Reason == "" {
			nd.Reason = builtOn(nd.InPlanBases)
		}
		p.Modules = append(p.Modules, nd)
	}
	for b, by := range ext {
		slices.Sort(by)
		p.External = append(p.External, External{Module: b, NeededBy: by})
	}
	slices.SortFunc(p.External, func(a, b External) int { return strings.Compare(a.Module, b.Module) })
	return p
}

// tierOrder orders members (in name order) by (tier, name), a counting
// sort: tier k is order[bound[k]:bound[k+1]].
func tierOrder(members []int32, tier []int, maxTier int) (order []int32, bound []int) {
	bound = make([]int, maxTier+2)
	for _, m := range members {
		bound[tier[m]+1]++
	}
	for k := 1; k < len(bound); k++ {
		bound[k] += bound[k-1]
	}
	order = make([]int32, len(members))
	next := slices.Clone(bound)
	for _, m := range members {
		order[next[tier[m]]] = m
		next[tier[m]]++
	}
	return order, bound
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func (ix *Index) source(i int32, t Trigger) Source {
	b := ix.man[i].Build
	s := Source{
		Repo:       b.Repo,
		Path:       b.Path,
		Dockerfile: b.DockerfileOrDefault(),
	}
	prov, sbom := b.Attests()
	s.NoProvenance, s.NoSBOM = !prov, !sbom
	s.Compression = b.AskCompression()
	if t.Commit != "" && t.Repo != "" && ix.repo[i] == NormaliseRepo(t.Repo) {
		s.Commit = t.Commit
	}
	return s
}

func (ix *Index) builtFrom(i int32) string {
	b := ix.man[i].Build
	if ix.dir[i] == "." {
		return "built from " + b.Repo
	}
	return "built from " + b.Repo + " path " + ix.dir[i]
}

// matchPaths reports whether a changed path is in module i's build context
// (or is its Dockerfile, or the Dockerfile's own .dockerignore, which
// BuildKit reads beside it: both may lie outside the context), or is a
// directory that holds either (`builds push
// --path services` for everything under services/; "/" or "." for the whole
// repository), naming the first such path.
func (ix *Index) matchPaths(i int32, paths []string) (string, bool) {
	dir, file := ix.dir[i], ix.file[i]
	first, count := "", 0
	for _, p := range paths {
		if dir == "." || p == dir || strings.HasPrefix(p, dir+"/") || p == file || p == file+".dockerignore" || holds(p, dir) || holds(p, file) {
			if count == 0 {
				first = p
			}
			count++
		}
	}
	switch count {
	case 0:
		return "", false
	case 1:
		return "changed path " + first, true
	default:
		return fmt.Sprintf("changed path %s (and %d more)", first, count-1), true
	}
}

// holds reports whether directory p (cleaned, relative; "." the root)
// holds path q.
func holds(p, q string) bool {
	return p == "." || strings.HasPrefix(q, p+"/")
}

// builtOn is the reason of a module that is in the plan because a base is.
func builtOn(bases []string) string {
	const show = 3
	var b strings.Builder
	b.Grow(32 + 16*min(len(bases), show))
	b.WriteString("built on ")
	for k, base := range bases[:min(len(bases), show)] {
		if k > 0 {
			b.WriteString(", ")
		}
		b.WriteString(base)
	}
	if len(bases) > show {
		b.WriteString(" and ")
		b.WriteString(strconv.Itoa(len(bases) - show))
		b.WriteString(" more")
	}
	b.WriteString(" (in plan)")
	return b.String()
}

func (ix *Index) cycleError(members []int32, cyclic []bool) error {
	// Every member mesh.Topo left out is on or below a cycle; walk back
	// through bases that are also left until a module repeats.
	left := func(i int32) bool { return cyclic[i] }
	var start int32 = -1
	for _, m := range members {
		if left(m) {
			start = m
			break
		}
	}
	seen := map[int32]int{}
	var walk []int32
	for cur := start; ; {
		if k, ok := seen[cur]; ok {
			walk = walk[k:]
			break
		}
		seen[cur] = len(walk)
		walk = append(walk, cur)
		next := int32(-1)
		for _, b := range ix.bases[cur] {
			if left(b) {
				next = b
				break
			}
		}
		if next < 0 { // cannot happen: a left module has a left base
			break
		}
		cur = next
	}
	names := make([]string, 0, len(walk)+1)
	for _, w := range walk {
		names = append(names, ix.names[w])
	}
	if len(names) > 0 {
		names = append(names, names[0])
	}
	return fmt.Errorf("%w: %s (each is built on the next; break the cycle in build.on, and see builds catalogue check)",
		ErrCycle, strings.Join(names, " → "))
}

func copyTrigger(t Trigger) Trigger {
	t.Paths = slices.Clone(t.Paths)
	t.Modules = slices.Clone(t.Modules)
	return t
}

// cleanPaths cleans changed paths, sorted and deduplicated.
func cleanPaths(paths []string) []string {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		if strings.TrimSpace(p) == "" {
			continue
		}
		out = append(out, cleanRel(p))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	if len(q) == 1 {
		return "module " + q[0]
	}
	return "modules " + strings.Join(q, ", ")
}
