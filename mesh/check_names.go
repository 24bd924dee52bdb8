package mesh

// Names, events and the wire's spelling: what a local name may be, and the
// local spelling the refusal suggests for a subject written in a manifest.

import (
	"fmt"
	"slices"
	"strings"
)

// What a string names, for the local spelling of a wire subject.
type wireKind int

const (
	wireName  wireKind = iota // a local name or event: the last part of a subject
	wireOwner                 // a seat or module: the owner part of a subject
	wireRef                   // a consumes or reads entry: owner.name
)

// wirePrefixes start the subjects of the wire: the mesh's own and the
// server's.
var wirePrefixes = []string{Root + ".", "$JS.", "$KV.", "_INBOX."}

// isWire reports whether s is spelled in the wire's grammar rather than as a
// local name: it starts like a subject, or has `>` or `#` as a token.
func isWire(s string) bool {
	if wirePrefixed(s) {
		return true
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			continue
		}
		if i-start == 1 && (s[start] == '>' || s[start] == '#') {
			return true
		}
		start = i + 1
	}
	return false
}

// localSpelling turns a wire subject back into the local name a manifest
// should hold instead, or "" when there is none.
func localSpelling(s string, kind wireKind) string {
	toks := strings.Split(s, ".")
	for i, t := range toks {
		if t == ">" || t == "#" {
			toks[i] = "**"
		}
	}
	var owner, name string
	switch {
	case len(toks) >= 5 && toks[0] == Root && (toks[1] == tokMod || toks[1] == tokSeat) &&
		(toks[3] == tokEvent || toks[3] == tokTool || toks[3] == tokAccept):
		owner, name = toks[2], strings.Join(toks[4:], ".")
	case len(toks) >= 2 && toks[0] == "$KV":
		owner, name, _ = strings.Cut(toks[1], "_")
	case toks[0] == Root || strings.HasPrefix(toks[0], "$") || toks[0] == "_INBOX":
		return ""
	default:
		name = strings.Join(toks, ".")
		if kind == wireRef {
			owner, name, _ = strings.Cut(name, ".")
		} else if kind == wireOwner {
			owner = name
		}
	}
	var out string
	switch kind {
	case wireName:
		if isEvent(name) {
			out = name
		}
	case wireOwner:
		if isName(owner) {
			out = owner
		}
	case wireRef:
		if isName(owner) && (name == "**" || isEvent(name)) {
			out = owner + "." + name
		}
	}
	if out == s {
		return ""
	}
	return out
}

// wire refuses s when it is spelled as the wire spells a subject, and
// reports whether it did.
func (c *checker) wire(m *Manifest, base string, i int, s string, kind wireKind) bool {
	if !isWire(s) {
		return false
	}
	if l := localSpelling(s, kind); l != "" {
		c.refuse(m, field(base, i), "%q is spelled as the wire spells it (the mesh derives subjects; `>` is written `**`): names are local, write %q", s, l)
	} else {
		c.refuse(m, field(base, i), "%q is spelled as the wire spells it: names are local, write a local name (such as `order.placed`, with `*` for one name and `**` for the rest) and the mesh derives the subject", s)
	}
	return true
}

// name checks a local name (module, seat, verb, tool, bucket) and reports
// whether it is valid.
func (c *checker) name(m *Manifest, base string, i int, s, what string, kind wireKind) bool {
	switch {
	case s == "":
		c.refuse(m, field(base, i), "an empty %s: write a name of lowercase letters, digits and '-'", what)
		return false
	case c.wire(m, base, i, s, kind):
		return false
	case !isName(s):
		c.refuse(m, field(base, i), "%q is not a %s name: write lowercase letters, digits and '-'%s", s, what, suggestion(sanitizeName(s)))
		return false
	}
	return true
}

// event checks a local event name and reports whether it is valid.
func (c *checker) event(m *Manifest, base string, i int, s string) bool {
	switch {
	case s == "":
		c.refuse(m, field(base, i), "an empty event: write a name such as `order.placed`")
		return false
	case c.wire(m, base, i, s, wireName):
		return false
	case !isEvent(s):
		c.refuse(m, field(base, i), "%q is not an event name: write dotted names of lowercase letters, digits and '-', with `*` for one name and `**` (last) for the rest%s", s, suggestion(sanitizeEvent(s)))
		return false
	}
	return true
}

// reserved refuses a verb, event or tool named after a token of the
// derivation.
func (c *checker) reserved(m *Manifest, base string, i int, s, what string) bool {
	if !slices.Contains(ReservedTokens, s) {
		return false
	}
	c.refuse(m, field(base, i), "%q is one of the derivation's own tokens (%s) and would be read as one: write another %s name, such as %q",
		s, strings.Join(ReservedTokens, ", "), what, s+"-"+what)
	return true
}

func suggestion(s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf(", such as %q", s)
}

// sanitizeName makes a valid name of s where it can ("Build_Agent" →
// "build-agent"); "" when it cannot.
func sanitizeName(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
		} else {
			dash = true
		}
	}
	if out := b.String(); isName(out) && out != s {
		return out
	}
	return ""
}

func sanitizeEvent(s string) string {
	parts := strings.Split(s, ".")
	for i, p := range parts {
		switch p {
		case "*", "**":
			continue
		case ">", "#":
			parts[i] = "**"
			continue
		}
		n := sanitizeName(p)
		if n == "" {
			if !isName(p) {
				return ""
			}
			n = p
		}
		parts[i] = n
	}
	if out := strings.Join(parts, "."); isEvent(out) && out != s {
		return out
	}
	return ""
}

// wirePrefixed reports whether s starts like a subject on the wire; alone,
// it checks the fields of build, which are paths and URLs, not names.
func wirePrefixed(s string) bool {
	if s == "" || s[0] != 'm' && s[0] != '$' && s[0] != '_' {
		return false
	}
	for _, p := range wirePrefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
