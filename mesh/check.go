package mesh

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Check runs every check on manifests held in memory, as Load does after
// decoding: each manifest on its own, then the catalogue as a whole. Where
// two manifests declare the same module or seat, the first in ms wins, as in
// NewCatalogue. The problems carry no line numbers (Load adds them) and are
// sorted by file.
func Check(ms []*Manifest) []Problem {
	ps := check(ms, nil, nil)
	sortProblems(ps)
	return ps
}

// isName is ValidName without a regular expression: the checks call it for
// every name of every manifest. TestGrammarAgrees keeps the two the same.
func isName(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
		case c == '-' && s[i-1] != '-':
		default:
			return false
		}
	}
	return true
}

// isEvent is ValidEvent without a regular expression: dotted parts, each a
// name or `*`, and `**` as the last of two or more.
func isEvent(s string) bool {
	for i := 0; ; i++ {
		part, rest, more := strings.Cut(s, ".")
		switch {
		case part == "*" || isName(part):
		case part == "**" && i > 0 && !more:
		default:
			return false
		}
		if !more {
			return true
		}
		s = rest
	}
}

// MaxHistory is the most values of a key a bucket keeps.
const MaxHistory = 64

var platformRE = regexp.MustCompile(`^[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?$`)

// checker collects problems. pos, when not nil, gives the line of a field of
// a manifest; broken names modules whose manifest could not be decoded, so
// that references to them are not reported as well.
type checker struct {
	probs  []Problem
	pos    map[*Manifest]positions
	broken map[string]string
}

func check(ms []*Manifest, pos map[*Manifest]positions, broken map[string]string) []Problem {
	c := &checker{pos: pos, broken: broken}
	live := make([]*Manifest, 0, len(ms))
	for _, m := range ms {
		if m != nil {
			c.manifest(m)
			live = append(live, m)
		}
	}
	c.catalogue(live)
	c.priorities(live)
	return c.probs
}

// field names item i of a list field; i < 0 names the field itself.
func field(base string, i int) string {
	if i < 0 {
		return base
	}
	return base + "[" + strconv.Itoa(i) + "]"
}

func (c *checker) add(m *Manifest, warning bool, f, format string, args ...any) {
	p := Problem{File: m.File, Field: f, Message: fmt.Sprintf(format, args...), Warning: warning}
	if c.pos != nil {
		p.Line = c.pos[m].line(f)
	}
	c.probs = append(c.probs, p)
}

func (c *checker) refuse(m *Manifest, f, format string, args ...any) {
	c.add(m, false, f, format, args...)
}

func (c *checker) warn(m *Manifest, f, format string, args ...any) {
	c.add(m, true, f, format, args...)
}

// dup returns the index of the first item of list equal to list[i], when
// it is before i; -1 otherwise.
func dup(list []string, i int) int {
	for j := range i {
		if list[j] == list[i] {
			return j
		}
	}
	return -1
}

// dupFunc is dup for lists of something other than strings.
func dupFunc[T any](list []T, i int, key func(T) string) int {
	k := key(list[i])
	for j := range i {
		if key(list[j]) == k {
			return j
		}
	}
	return -1
}

func (c *checker) refuseDup(m *Manifest, base string, list []string, i int) bool {
	if j := dup(list, i); j >= 0 {
		c.refuse(m, field(base, i), "%q is listed twice (first as %s): remove this one", list[i], field(base, j))
		return true
	}
	return false
}

func listOr(list []string, none string) string {
	if len(list) == 0 {
		return none
	}
	return strings.Join(list, ", ")
}
