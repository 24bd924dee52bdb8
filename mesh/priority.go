package mesh

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// A plan's priority orders it against the other plans running: the
// controller hands an idle machine to the highest priority first (see the
// scheduler in package cascade). A push or a rebuild may name one
// (`builds push --priority 10`); otherwise a push takes the default its
// repository declares for the pushed ref, beside build.repo:
//
//	build:
//	  repo: https://git.example/fleet.git
//	  priority: {main: 10, "*": 0}
//
// A key is a branch name (main, matching refs/heads/main), a full ref
// (refs/tags/v1) or * (any other ref); a value is a whole number from
// MinPriority to MaxPriority. Every module built from one repository
// declares the same table, or none: the check refuses two that disagree.

// Priority bounds.
const (
	MinPriority = -1000
	MaxPriority = 1000
	// AnyRef is the key of the priority of every ref not named.
	AnyRef = "*"
)

// PriorityFor is the priority the build declares for a pushed ref: the
// full ref's, else its branch's (refs/heads/main: main), else AnyRef's.
func (b *Build) PriorityFor(ref string) (int, bool) {
	if b == nil || len(b.Priority) == 0 {
		return 0, false
	}
	if p, ok := b.Priority[ref]; ok && ref != "" {
		return p, true
	}
	if br, ok := strings.CutPrefix(ref, "refs/heads/"); ok {
		if p, ok := b.Priority[br]; ok {
			return p, true
		}
	}
	p, ok := b.Priority[AnyRef]
	return p, ok
}

// priority checks one manifest's build.priority: each key a ref, each
// value in bounds.
func (c *checker) priority(m *Manifest) {
	for _, ref := range slices.Sorted(maps.Keys(m.Build.Priority)) {
		f := "build.priority." + ref
		switch {
		case ref == AnyRef:
		case !validRef(ref):
			c.refuse(m, f, "%q is not a ref: write a branch name (main), a full ref (refs/tags/v1) or %q for every other ref", ref, AnyRef)
			continue
		}
		if p := m.Build.Priority[ref]; p < MinPriority || p > MaxPriority {
			c.refuse(m, f, "priority %d: write a whole number from %d to %d (higher is served first; 0 is the default)", p, MinPriority, MaxPriority)
		}
	}
}

// priorities refuses modules built from one repository that declare
// different priority tables: a push of the repository has one priority.
func (c *checker) priorities(ms []*Manifest) {
	first := map[string]*Manifest{}
	for _, m := range ms {
		if m.Build == nil || len(m.Build.Priority) == 0 || m.Build.Repo == "" {
			continue
		}
		repo := normalRepo(m.Build.Repo)
		prev, ok := first[repo]
		if !ok {
			first[repo] = m
			continue
		}
		if !maps.Equal(prev.Build.Priority, m.Build.Priority) {
			c.refuse(m, "build.priority", "%s declares %s for %s, and %s (module %s) declares %s: a push of a repository has one priority; write the same table in both, or leave it out of one",
				m.Module, showPriorities(m.Build.Priority), m.Build.Repo, where(prev), prev.Module, showPriorities(prev.Build.Priority))
		}
	}
}

// normalRepo is the form repositories are compared in (as the planner's
// NormaliseRepo): surrounding space, trailing slashes and ".git" removed.
func normalRepo(repo string) string {
	r := strings.TrimSpace(repo)
	for {
		prev := r
		r = strings.TrimSuffix(strings.TrimRight(r, "/"), ".git")
		if r == prev {
			return r
		}
	}
}

func showPriorities(p map[string]int) string {
	keys := slices.SortedFunc(maps.Keys(p), func(a, b string) int {
		// * last, as one reads a table of exceptions.
		if (a == AnyRef) != (b == AnyRef) {
			if a == AnyRef {
				return 1
			}
			return -1
		}
		return cmp.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, p[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// validRef reports whether s can name a git ref: no space, control
// character, "..", or any of ~^:?*[\, not ending in / or .lock, not
// starting with / or -.
func validRef(s string) bool {
	if s == "" || strings.HasPrefix(s, "/") || strings.HasPrefix(s, "-") || strings.HasSuffix(s, "/") ||
		strings.HasSuffix(s, ".lock") || strings.HasSuffix(s, ".") || strings.Contains(s, "..") || strings.Contains(s, "//") || strings.Contains(s, "@{") {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || strings.ContainsRune("~^:?*[\\", r) {
			return false
		}
	}
	return true
}
