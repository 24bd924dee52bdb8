package cascade

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// # Why a module was built
//
// A released module keeps the components of its input key (KeyInputs), not
// only their hash, and, from when its plan was made, its previous build
// (PreviousBuild: the module's current image then, with that build's
// inputs and the paths of the build context that changed since, from the
// controller's clone). WhyOf compares them: for a built module, the inputs
// that differ — context tree (and its changed paths), Dockerfile, platform,
// each base's digest old → new — or "forced", or "first build"; for an
// unchanged one, the plan whose build it reused and why the key matched;
// for a blocked or cancelled one, what stopped it.

// KeyInputs are the components of a module's input key (InputKey).
type KeyInputs struct {
	Platform   string `json:"platform,omitempty"`
	Tree       string `json:"tree"`
	Path       string `json:"path,omitempty"`
	Dockerfile string `json:"dockerfile,omitempty"`
	// DockerfileTree is the tree of the Dockerfile's directory when it
	// lies outside the context.
	DockerfileTree string            `json:"dockerfile_tree,omitempty"`
	Commit         string            `json:"commit,omitempty"`
	Bases          map[string]string `json:"bases,omitempty"`
}

// PreviousBuild is a module's build before its plan: its current image
// when the plan was made.
type PreviousBuild struct {
	Plan   string     `json:"plan"`
	Digest string     `json:"digest"`
	Commit string     `json:"commit,omitempty"`
	Inputs *KeyInputs `json:"inputs,omitempty"`
	// Changed are the paths (relative to the build context) that differ
	// between the previous build's context tree and this plan's; nil when
	// the trees are equal or could not be compared.
	Changed []string `json:"changed,omitempty"`
}

// inputsOf is module i's key components, nil when it has no key.
func (s *State) inputsOf(i int) *KeyInputs {
	m := s.Modules[i]
	if m.Tree == "" {
		return nil
	}
	bases := make(map[string]string, len(s.ix.bases[i])+len(m.External))
	for _, b := range s.ix.bases[i] {
		bases[s.Modules[b].Module] = s.Modules[b].Digest
	}
	for _, b := range m.External {
		bases[b] = s.External[b]
	}
	return &KeyInputs{
		Platform: strings.Join(m.Source.Platforms, ","), Tree: m.Tree, Path: m.Source.Path,
		Dockerfile: m.Source.Dockerfile, DockerfileTree: m.DockerfileTree, Commit: m.Source.Commit, Bases: bases,
	}
}

// InputChange is one input that differs from the previous build.
type InputChange struct {
	// Input is "context", "dockerfile", "path", "platform" or "base NAME".
	Input string `json:"input"`
	Old   string `json:"old,omitempty"`
	New   string `json:"new,omitempty"`
	// Paths are the changed paths of the context (Input "context").
	Paths []string `json:"paths,omitempty"`
}

// Why is why a module of a plan is in its state.
type Why struct {
	Plan   string      `json:"plan"`
	Module string      `json:"module"`
	State  ModuleState `json:"state"`
	// Verdict is one of: "first build", "forced", "inputs changed",
	// "unchanged", "blocked", "cancelled", "not addressed" (no input key:
	// the context could not be resolved), "inputs as before" (built, but
	// its key was not known: pruned, or the previous build not recorded).
	Verdict string `json:"verdict"`
	// Summary is the one line `builds show` prints.
	Summary  string         `json:"summary"`
	Changes  []InputChange  `json:"changes,omitempty"`
	Previous *PreviousBuild `json:"previous,omitempty"`
	// Reuses is the plan whose build an unchanged module reused.
	Reuses string `json:"reuses,omitempty"`
	// BlockedBy is the failed module a blocked module waits on.
	BlockedBy string `json:"blocked_by,omitempty"`
}

// WhyOf says why m, a module of plan, is built, unchanged, blocked or
// cancelled; forced is the plan's trigger's Force.
func WhyOf(plan string, forced bool, m ModuleStatus) Why {
	w := Why{Plan: plan, Module: m.Module, State: m.State, Previous: m.Previous}
	w.Changes = changes(m)
	switch {
	case m.State == Blocked:
		w.Verdict, w.BlockedBy = "blocked", m.BlockedBy
		w.Summary = fmt.Sprintf("blocked: built on %s, which failed; retrying %s releases it", m.BlockedBy, m.BlockedBy)
	case m.State == Cancelled || m.State == Cancelling:
		w.Verdict = "cancelled"
		w.Summary = "cancelled"
		if m.Message != "" {
			w.Summary += ": " + m.Message
		}
	case m.State == Unchanged:
		w.Verdict, w.Reuses = "unchanged", m.Reuses
		w.Summary = fmt.Sprintf("unchanged: its input key (context tree %s, Dockerfile, platform, %s) is the one plan %s built, so its image %s is reused",
			short(m.Tree), basesPhrase(m.Inputs), m.Reuses, short(m.Digest))
	case forced:
		w.Verdict, w.Summary = "forced", "forced: the plan builds every module (--force)"
		if len(w.Changes) > 0 {
			w.Summary += "; " + describe(w.Changes)
		}
	case m.Key == "" && m.Tree == "" && m.State != Waiting:
		w.Verdict = "not addressed"
		w.Summary = "built without an input key: the controller could not resolve its build context"
	case m.Previous == nil:
		w.Verdict, w.Summary = "first build", "first build: no earlier image of this module"
	case len(w.Changes) > 0:
		w.Verdict, w.Summary = "inputs changed", describe(w.Changes)
	case m.State == Waiting:
		w.Verdict, w.Summary = "waiting", "waiting for its bases: "+strings.Join(m.Bases, ", ")
	default:
		w.Verdict = "inputs as before"
		w.Summary = "inputs as before, but their key was not known (pruned, or the previous build recorded none)"
	}
	return w
}

// changes are the inputs of m that differ from its previous build's.
func changes(m ModuleStatus) []InputChange {
	if m.Previous == nil || m.Previous.Inputs == nil || m.Inputs == nil {
		return nil
	}
	old, now := m.Previous.Inputs, m.Inputs
	var out []InputChange
	if old.Tree != now.Tree {
		out = append(out, InputChange{Input: "context", Old: old.Tree, New: now.Tree, Paths: m.Previous.Changed})
	}
	if old.DockerfileTree != now.DockerfileTree {
		out = append(out, InputChange{Input: "dockerfile directory", Old: old.DockerfileTree, New: now.DockerfileTree})
	}
	for _, f := range []struct{ name, old, new string }{
		{"dockerfile", old.Dockerfile, now.Dockerfile}, {"path", old.Path, now.Path}, {"platform", old.Platform, now.Platform},
	} {
		if f.old != f.new {
			out = append(out, InputChange{Input: f.name, Old: f.old, New: f.new})
		}
	}
	names := slices.Sorted(maps.Keys(maps.Collect(func(yield func(string, bool) bool) {
		for k := range old.Bases {
			yield(k, true)
		}
		for k := range now.Bases {
			yield(k, true)
		}
	})))
	for _, b := range names {
		if old.Bases[b] != now.Bases[b] {
			out = append(out, InputChange{Input: "base " + b, Old: old.Bases[b], New: now.Bases[b]})
		}
	}
	return out
}

// describe is changes in one line.
func describe(cs []InputChange) string {
	var parts []string
	for _, c := range cs {
		switch {
		case c.Input == "context" && len(c.Paths) > 0:
			parts = append(parts, "context changed: "+strings.Join(c.Paths, ", "))
		case c.Input == "context":
			parts = append(parts, fmt.Sprintf("context tree %s → %s", short(c.Old), short(c.New)))
		case c.Input == "dockerfile directory":
			parts = append(parts, fmt.Sprintf("the Dockerfile's directory, tree %s → %s", orNone(short(c.Old)), orNone(short(c.New))))
		case strings.HasPrefix(c.Input, "base "):
			parts = append(parts, fmt.Sprintf("%s %s → %s", c.Input, orNone(short(c.Old)), orNone(short(c.New))))
		default:
			parts = append(parts, fmt.Sprintf("%s %q → %q", c.Input, c.Old, c.New))
		}
	}
	return strings.Join(parts, "; ")
}

func basesPhrase(in *KeyInputs) string {
	if in == nil || len(in.Bases) == 0 {
		return "no bases"
	}
	var parts []string
	for _, b := range slices.Sorted(maps.Keys(in.Bases)) {
		parts = append(parts, b+"@"+short(in.Bases[b]))
	}
	return "bases " + strings.Join(parts, ", ")
}

// short is a digest or tree id cut for a line: sha256:0123456789ab.
func short(s string) string {
	alg, hex, ok := strings.Cut(s, ":")
	if !ok {
		alg, hex = "", s
	}
	if len(hex) > 12 {
		hex = hex[:12]
	}
	if alg != "" {
		return alg + ":" + hex
	}
	return hex
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// previous records, for every module of st, its build before the plan
// (the controller's current image of it) and, when the context's tree
// changed, the paths that did, from the controller's clone.
func (c *Controller) previous(ctx context.Context, st *State) {
	for i := range st.Modules {
		m := &st.Modules[i]
		cur, ok := c.current[m.Module]
		if !ok || cur.Digest == "" {
			continue
		}
		p := &PreviousBuild{Plan: cur.Plan, Digest: cur.Digest, Commit: cur.Commit, Inputs: cur.Inputs}
		if cur.Inputs != nil && cur.Inputs.Tree != "" && m.Tree != "" && cur.Inputs.Tree != m.Tree && c.trees != nil {
			rctx, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
			paths, err := c.trees.Changed(rctx, m.Source.Repo, cur.Inputs.Tree, m.Tree)
			cancel()
			if err != nil {
				c.log.Warn("comparing a module's context with its previous build's", "plan", st.Plan, "module", m.Module, "err", err)
			}
			p.Changed = paths
		}
		m.Previous = p
	}
}
