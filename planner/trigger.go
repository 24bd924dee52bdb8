package planner

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// Trigger kinds.
const (
	KindPush    = "push"
	KindRebuild = "rebuild"
)

// Trigger is what a plan is made for: a push to a repository, or an
// operator's rebuild of named modules.
type Trigger struct {
	// Kind is KindPush or KindRebuild.
	Kind string `json:"kind"`
	// Repo is the pushed repository (any git URL or a local path).
	Repo string `json:"repo,omitempty"`
	// Commit is the pushed commit. A rebuild may name one too, for the
	// modules built from Repo.
	Commit string `json:"commit,omitempty"`
	// Ref is the pushed ref (refs/heads/main), for display only.
	Ref string `json:"ref,omitempty"`
	// Paths are the changed paths, relative to the repository root. Empty
	// means "anything may have changed": every module of the repository.
	Paths []string `json:"paths,omitempty"`
	// Modules are the modules a rebuild asks for.
	Modules []string `json:"modules,omitempty"`
	// ID is the request id of a rebuild: it names the plan, so each request
	// needs its own, and a request submitted twice is one plan.
	ID string `json:"id,omitempty"`
	// Force builds every module of the plan, even one whose inputs were
	// built before (which is otherwise settled unchanged, reusing that
	// build's image).
	Force bool `json:"force,omitempty"`
}

// Validate checks the fields its kind needs. Errors wrap ErrTrigger.
func (t Trigger) Validate() error {
	bad := func(why string) error { return fmt.Errorf("%w: %s", ErrTrigger, why) }
	switch t.Kind {
	case KindPush:
		if strings.TrimSpace(t.Repo) == "" {
			return bad("push: repo is empty")
		}
		if t.Commit == "" {
			return bad("push: commit is empty")
		}
	case KindRebuild:
		if len(t.Modules) == 0 {
			return bad("rebuild: no modules named (name at least one, e.g. builds rebuild runtime)")
		}
		if t.ID == "" {
			return bad("rebuild: request id is empty (it names the plan; give each request its own)")
		}
	default:
		return bad(fmt.Sprintf("kind %q, want %q or %q", t.Kind, KindPush, KindRebuild))
	}
	return nil
}

// String summarises the trigger in one line, e.g.
// "push https://git.example/fleet.git@9fceb02 (refs/heads/main), 2 changed paths"
// or "rebuild runtime, tool-a (request 42)".
func (t Trigger) String() string {
	var b strings.Builder
	switch t.Kind {
	case KindPush:
		fmt.Fprintf(&b, "push %s@%s", t.Repo, ShortCommit(t.Commit))
		if t.Ref != "" {
			fmt.Fprintf(&b, " (%s)", t.Ref)
		}
		switch len(t.Paths) {
		case 0:
		case 1:
			fmt.Fprintf(&b, ", changed %s", t.Paths[0])
		default:
			fmt.Fprintf(&b, ", %d changed paths", len(t.Paths))
		}
	case KindRebuild:
		fmt.Fprintf(&b, "rebuild %s", strings.Join(t.Modules, ", "))
		if t.Commit != "" {
			fmt.Fprintf(&b, " at %s@%s", t.Repo, ShortCommit(t.Commit))
		}
		fmt.Fprintf(&b, " (request %s)", t.ID)
		if t.Force {
			b.WriteString(", forced")
		}
	default:
		fmt.Fprintf(&b, "%s", t.Kind)
	}
	return b.String()
}

// ShortCommit abbreviates a commit to 7 characters for display.
func ShortCommit(c string) string {
	if len(c) > 7 {
		return c[:7]
	}
	return c
}

// maxRequestID is the longest request id used verbatim in a plan id; longer
// ones are hashed, so that a plan id, and the ask ids derived from it, stay
// short.
const maxRequestID = 40

var requestIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// PlanID derives a plan's id from its trigger, deterministically:
//
//   - push: "p-" and the first 12 hex digits of
//     sha256(NormaliseRepo(repo) + "\x00" + commit), so the same commit
//     pushed twice (or to the same repository spelt with ".git") is one plan;
//   - rebuild: "r-" and the request id when it is at most 40 of
//     [A-Za-z0-9_-], otherwise "r-" and the first 12 hex digits of its
//     sha256.
//
// A plan id is 1-42 of [A-Za-z0-9_-]: no dots, usable in ask ids, KV keys
// and subjects.
func PlanID(t Trigger) string {
	switch t.Kind {
	case KindPush:
		return "p-" + hash12(NormaliseRepo(t.Repo)+"\x00"+t.Commit)
	default:
		if len(t.ID) <= maxRequestID && requestIDRE.MatchString(t.ID) {
			return "r-" + t.ID
		}
		return "r-" + hash12(t.ID)
	}
}

func hash12(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}

// NormaliseRepo returns the form repositories are compared in: surrounding
// space, trailing slashes and a trailing ".git" removed, so
// "https://git.example/fleet.git/", "https://git.example/fleet.git" and
// "https://git.example/fleet" are one repository. Nothing else is changed
// (scheme and host case are kept).
func NormaliseRepo(repo string) string {
	r := strings.TrimSpace(repo)
	for {
		prev := r
		r = strings.TrimRight(r, "/")
		r = strings.TrimSuffix(r, ".git")
		if r == prev {
			return r
		}
	}
}
