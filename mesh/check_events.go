package mesh

// Matching consumed events against what an emitter emits, wildcards
// included.

import (
	"strings"
)

// emitIndex speeds up matching against an emitter that emits many events:
// its exact events go in a set, so that a consumed event without a wildcard
// is found in one lookup.
type emitIndex map[string]*emitSet

type emitSet struct {
	exact map[string]struct{}
	wild  []string
}

const emitIndexFrom = 16

func (x emitIndex) emits(emitter string, patterns []string, event string) bool {
	if len(patterns) < emitIndexFrom || hasWildcard(event) {
		return matchesAny(patterns, event)
	}
	s, ok := x[emitter]
	if !ok {
		s = &emitSet{exact: make(map[string]struct{}, len(patterns))}
		for _, p := range patterns {
			if hasWildcard(p) {
				s.wild = append(s.wild, p)
			} else {
				s.exact[p] = struct{}{}
			}
		}
		x[emitter] = s
	}
	if _, ok := s.exact[event]; ok {
		return true
	}
	return matchesAny(s.wild, event)
}

func hasWildcard(s string) bool { return strings.IndexByte(s, '*') >= 0 }

func matchesAny(patterns []string, event string) bool {
	for _, p := range patterns {
		if overlaps(p, event) {
			return true
		}
	}
	return false
}

// overlaps reports whether two event patterns can name the same event: `*`
// matches one name and `**` one or more, on either side. So a consumed
// `log.*` matches an emitted `log.*`, a consumed `*` any single-name event,
// and a consumed `log.abc` an emitted `log.*`.
func overlaps(a, b string) bool {
	if a == b {
		return true
	}
	for {
		ta, ra, moreA := strings.Cut(a, ".")
		tb, rb, moreB := strings.Cut(b, ".")
		if ta == "**" || tb == "**" {
			return true
		}
		if ta != tb && ta != "*" && tb != "*" {
			return false
		}
		if !moreA || !moreB {
			return moreA == moreB
		}
		a, b = ra, rb
	}
}
