package cascade

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/mesh"
)

// KeyRecord is what an input key was built to: kept by the caller, one per
// key, and handed to the state by the lookup SetKnown sets.
type KeyRecord struct {
	Digest string `json:"digest"`
	Image  string `json:"image,omitempty"`
	Module string `json:"module"`
	// Plan is the plan that built it.
	Plan   string `json:"plan"`
	Commit string `json:"commit,omitempty"`
}

// Inputs address a module's build context: the full commit its source
// resolved to and the git tree id of its context path at it.
type Inputs struct {
	Commit string `json:"commit"`
	Tree   string `json:"tree"`
	// DockerfileTree is the tree of the directory that holds the
	// Dockerfile when it lies outside the context
	// (mesh.DockerfileOutside); empty otherwise.
	DockerfileTree string `json:"dockerfile_tree,omitempty"`
}

// Address records where each module's build context comes from, by module
// (modules not in inputs, or with an empty tree, stay unaddressed: they
// have no input key and are always submitted). A module's source commit
// becomes the resolved one, so that its ask builds what its key names.
// Call it before Start.
func (s *State) Address(inputs map[string]Inputs) {
	for i := range s.Modules {
		m := &s.Modules[i]
		in, ok := inputs[m.Module]
		if !ok || in.Tree == "" {
			continue
		}
		m.Tree = in.Tree
		m.DockerfileTree = in.DockerfileTree
		if in.Commit != "" {
			m.Source.Commit = in.Commit
		}
	}
}

// SetKnown sets how the state learns whether an input key was built
// before (nil: never). It is not persisted: set it again after a reload.
func (s *State) SetKnown(known func(key string) (KeyRecord, bool)) { s.known = known }

// Reused returns the modules settled unchanged since it was last called,
// in the order they settled: the caller records them (their current
// image) as it does built modules.
func (s *State) Reused() []string {
	out := s.reused
	s.reused = nil
	return out
}

// keyOf is module i's input key, "" when its build context is not
// addressed.
func (s *State) keyOf(i int) string {
	m := s.Modules[i]
	if m.Tree == "" {
		return ""
	}
	bases := make(map[string]string, len(s.ix.bases[i])+len(m.External))
	for _, b := range s.ix.bases[i] {
		bases[s.Modules[b].Module] = s.Modules[b].Digest
	}
	for _, b := range m.External {
		bases[b] = s.External[b]
	}
	// A module of several platforms is one output, its index: its key
	// names every platform (one platform's key is that platform's).
	platform := strings.Join(m.Source.Platforms, ",")
	return InputKey(m.Module, platform, m.Tree, m.Source.Path, m.Source.Dockerfile, m.DockerfileTree, m.Source.Compression, bases)
}

// InputKey is the input key of a build: a hash of the module, its platform,
// the git tree id of its build context, the context path and Dockerfile,
// the tree of the Dockerfile's directory when it lies outside the context
// (empty otherwise, so that the keys of the others are as before), its
// layer compression when not the default (empty: gzip, so that keys
// made before build.compression are the same), and the digest of every
// base by module. Anything that could change the image changes the key; a
// commit that leaves the context alone does not. It is 64 hex digits.
func InputKey(module, platform, tree, path, dockerfile, dockerfileTree, compression string, bases map[string]string) string {
	h := sha256.New()
	field := func(k, v string) { fmt.Fprintf(h, "%s %d:%s\n", k, len(v), v) }
	field("key", "v1")
	field("module", module)
	field("platform", platform)
	field("tree", tree)
	field("path", path)
	field("dockerfile", dockerfile)
	if dockerfileTree != "" {
		field("dockerfile tree", dockerfileTree)
	}
	if compression != "" {
		field("compression", compression)
	}
	for _, b := range slices.Sorted(maps.Keys(bases)) {
		field("base "+b, bases[b])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// known looks an input key up among those built.
func (c *Controller) known(key string) (KeyRecord, bool) {
	r, ok := c.keys[key]
	return r, ok
}

// address resolves, from the controller's clones, each module's commit and
// the tree id of its build context, one fetch per repository and commit. A
// module whose context cannot be resolved (the repository unreachable, the
// path missing) is left unaddressed and logged: it has no input key, and is
// dispatched (its agent reports what is wrong with its source).
//
// The sources are resolved addressParallel at a time: a plan built on a
// changed base holds modules of many repositories, each at its current
// commit (its repository's HEAD, asked of its git server), and the loop
// waits for the slowest of them, not for their sum.
func (c *Controller) address(ctx context.Context, st *State) {
	if c.trees == nil {
		return
	}
	type source struct{ repo, commit string }
	paths := map[source][]string{}
	for _, m := range st.Modules {
		k := source{m.Source.Repo, m.Source.Commit}
		paths[k] = append(paths[k], m.Source.Path)
		if dir, outside := mesh.DockerfileOutside(m.Source.Path, m.Source.Dockerfile); outside {
			paths[k] = append(paths[k], dir)
		}
	}
	var mu sync.Mutex
	resolved := map[source]gitcache.Resolution{}
	var g errgroup.Group
	g.SetLimit(addressParallel)
	for _, k := range slices.SortedFunc(maps.Keys(paths), func(a, b source) int {
		return cmp.Or(strings.Compare(a.repo, b.repo), strings.Compare(a.commit, b.commit))
	}) {
		if err, failed := c.fetchFailed[fetchSource{k.repo, k.commit}]; failed {
			// Fetched beside the loop, and failed: not tried again here.
			c.log.Warn("build contexts not addressed: their modules are dispatched", "plan", st.Plan, "repo", k.repo, "err", err)
			continue
		}
		ps := paths[k]
		commit := k.commit
		if h, ok := c.heads[k.repo]; ok && commit == "" {
			commit = h // its HEAD, fetched beside the loop just now
		}
		g.Go(func() error {
			rctx, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
			res, err := c.trees.Resolve(rctx, k.repo, commit, ps)
			cancel()
			if err != nil {
				c.log.Warn("build contexts not addressed: their modules are dispatched", "plan", st.Plan, "repo", k.repo, "err", err)
				return nil
			}
			mu.Lock()
			resolved[k] = res
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	inputs := map[string]Inputs{}
	for _, m := range st.Modules {
		if res, ok := resolved[source{m.Source.Repo, m.Source.Commit}]; ok {
			in := Inputs{Commit: res.Commit, Tree: res.Trees[m.Source.Path]}
			if dir, outside := mesh.DockerfileOutside(m.Source.Path, m.Source.Dockerfile); outside {
				// Its Dockerfile's directory is an input too: without
				// it the module is not addressed (its agent says what
				// is missing).
				if in.DockerfileTree = res.Trees[dir]; in.DockerfileTree == "" {
					in.Tree = ""
				}
			}
			inputs[m.Module] = in
		}
	}
	st.Address(inputs)
}

// addressParallel is how many sources (a repository at a commit) address
// resolves at once.
const addressParallel = 8
