package mesh

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
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

// manifest runs the checks that need nothing but the manifest itself.
func (c *checker) manifest(m *Manifest) {
	if m.Module == "" {
		c.refuse(m, "module", "the module has no name: write `module: NAME` (lowercase letters, digits and '-'), unique in the catalogue")
	} else {
		c.name(m, "module", -1, m.Module, "module", wireOwner)
	}
	if m.Build != nil {
		c.build(m)
	}
	for i := range m.Seats {
		c.seat(m, i)
	}
	for i, h := range m.Holds {
		if !c.name(m, "holds", i, h, "seat", wireOwner) || c.refuseDup(m, "holds", m.Holds, i) {
			continue
		}
		if _, ok := MeshSeat(h); ok {
			continue
		}
		if strings.HasPrefix(h, "mesh-") {
			c.refuse(m, field("holds", i), "the mesh has no seat %q: its own seats are %s", h, meshSeatNames())
			continue
		}
		c.refuse(m, field("holds", i), "holds names the mesh's own seats (%s), and %q is not one: declare the module's own seat under seats (`seats: [{seat: %s, scope: node}]`), or, to submit work to another module's seat, write `uses: [%s]`",
			meshSeatNames(), h, h, h)
	}
	for i, e := range m.Emits {
		c.emitted(m, "emits", i, m.Emits, e, "")
	}
	for i, ref := range m.Consumes {
		if c.wire(m, "consumes", i, ref, wireRef) || c.refuseDup(m, "consumes", m.Consumes, i) {
			continue
		}
		emitter, event, ok := SplitRef(ref)
		switch {
		case !ok:
			c.refuse(m, field("consumes", i), "%q is not <emitter>.<event>: write the emitting module or seat, a dot and the event, such as `mesh-git.pushed`", ref)
		case !isName(emitter):
			c.refuse(m, field("consumes", i), "%q does not start with a module or seat name: write lowercase letters, digits and '-' before the first dot%s", ref, suggestion(sanitizeName(emitter)))
		case event != "**" && !isEvent(event):
			c.refuse(m, field("consumes", i), "%q is not an event name: after %q write dotted names of lowercase letters, digits and '-', with `*` for one name and `**` (last) for the rest", event, emitter+".")
		}
	}
	for i, u := range m.Uses {
		if c.name(m, "uses", i, u, "seat", wireOwner) {
			c.refuseDup(m, "uses", m.Uses, i)
		}
	}
	for i, t := range m.Serves {
		if c.name(m, "serves", i, t, "tool", wireName) && !c.reserved(m, "serves", i, t, "tool") {
			c.refuseDup(m, "serves", m.Serves, i)
		}
	}
	for i := range m.State {
		c.bucket(m, i)
	}
	for i, ref := range m.Reads {
		if c.wire(m, "reads", i, ref, wireRef) || c.refuseDup(m, "reads", m.Reads, i) {
			continue
		}
		owner, bucket, ok := SplitRef(ref)
		switch {
		case !ok || strings.Contains(bucket, "."):
			c.refuse(m, field("reads", i), "%q is not <module>.<bucket>: write the owning module, a dot and the bucket, such as `build-controller.plans`", ref)
		case !isName(owner):
			c.refuse(m, field("reads", i), "%q does not start with a module name: write lowercase letters, digits and '-' before the dot%s", ref, suggestion(sanitizeName(owner)))
		case !isName(bucket):
			c.refuse(m, field("reads", i), "%q is not a bucket name: after %q write lowercase letters, digits and '-'%s", bucket, owner+".", suggestion(sanitizeName(bucket)))
		}
	}
}

// emitted checks one event a module or one of its seats emits; seat is the
// seat's name, "" for the module's own events.
func (c *checker) emitted(m *Manifest, base string, i int, list []string, e, seat string) {
	if !c.event(m, base, i, e) || c.reserved(m, base, i, e, "event") || c.refuseDup(m, base, list, i) {
		return
	}
	head, rest, ok := strings.Cut(e, ".")
	if !ok {
		return
	}
	switch {
	case head == m.Module:
		c.refuse(m, field(base, i), "%q repeats the module's own name; names are local, and the mesh adds the module: write %q", e, rest)
	case seat != "" && head == seat:
		c.refuse(m, field(base, i), "%q repeats the seat's own name; names are local, and the mesh adds the seat: write %q", e, rest)
	}
}

func meshSeatNames() string {
	names := make([]string, len(MeshSeats))
	for i, s := range MeshSeats {
		names[i] = s.Seat
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func (c *checker) seat(m *Manifest, i int) {
	s := m.Seats[i]
	base := field("seats", i)
	switch {
	case s.Seat == "":
		c.refuse(m, base+".seat", "the seat has no name: write `seat: NAME` (lowercase letters, digits and '-')")
	case isWire(s.Seat):
		c.wire(m, base+".seat", -1, s.Seat, wireOwner)
	case strings.HasPrefix(s.Seat, "mesh-"):
		if _, ok := MeshSeat(s.Seat); ok {
			c.refuse(m, base+".seat", "%q is the mesh's own seat, declared by the mesh (the mesh-* prefix is the mesh's own): to hold it write `holds: [%s]` and remove this seat", s.Seat, s.Seat)
		} else {
			own := strings.TrimPrefix(s.Seat, "mesh-")
			c.refuse(m, base+".seat", "the mesh-* prefix is the mesh's own (its seats are %s; to hold one write `holds: [mesh-git]`): name the module's own seat without it, such as %q", meshSeatNames(), own)
		}
	case c.name(m, base+".seat", -1, s.Seat, "seat", wireOwner):
		if j := dupFunc(m.Seats, i, func(s Seat) string { return s.Seat }); j >= 0 {
			c.refuse(m, base+".seat", "seat %q is declared twice in this manifest (first as seats[%d]): merge the two", s.Seat, j)
		}
	}
	switch {
	case s.Scope == "":
		c.refuse(m, base+".scope", "the seat has no scope: write `scope: node` or `scope: mesh`")
	case c.wire(m, base+".scope", -1, s.Scope, wireName):
	case s.Scope != ScopeNode && s.Scope != ScopeMesh:
		c.refuse(m, base+".scope", "%q is not a scope: write `scope: node` or `scope: mesh`", s.Scope)
	}
	verbs := make([]string, len(s.Accepts))
	for j, a := range s.Accepts {
		if c.wire(m, base+".accepts", j, a, wireName) {
			continue
		}
		acc, err := ParseAccept(a)
		if err != nil {
			c.refuse(m, field(base+".accepts", j), "%s", err)
			continue
		}
		if !isName(acc.Verb) {
			c.refuse(m, field(base+".accepts", j), "%q is not a verb: write lowercase letters, digits and '-'%s, then optionally `retain DURATION`", acc.Verb, suggestion(sanitizeName(acc.Verb)))
			continue
		}
		verbs[j] = acc.Verb
		if c.reserved(m, base+".accepts", j, acc.Verb, "verb") {
			continue
		}
		if k := dup(verbs, j); k >= 0 {
			c.refuse(m, field(base+".accepts", j), "verb %q is accepted twice (first in %s): keep one entry", acc.Verb, field(base+".accepts", k))
		}
	}
	for j, e := range s.Emits {
		c.emitted(m, base+".emits", j, s.Emits, e, s.Seat)
	}
	for j, t := range s.Serves {
		if c.name(m, base+".serves", j, t, "tool", wireName) && !c.reserved(m, base+".serves", j, t, "tool") {
			c.refuseDup(m, base+".serves", s.Serves, j)
		}
	}
}

func (c *checker) bucket(m *Manifest, i int) {
	b := m.State[i]
	base := field("state", i)
	if b.Name == "" {
		c.refuse(m, base+".name", "the bucket has no name: write `name: BUCKET` (lowercase letters, digits and '-')")
	} else if c.name(m, base+".name", -1, b.Name, "bucket", wireName) {
		if j := dupFunc(m.State, i, func(b Bucket) string { return b.Name }); j >= 0 {
			c.refuse(m, base+".name", "bucket %q is declared twice (first as state[%d]): keep one", b.Name, j)
		}
	}
	if b.History < 0 || b.History > MaxHistory {
		c.refuse(m, base+".history", "history %d: write 1 to %d, the values of a key the bucket keeps (0 means 1)", b.History, MaxHistory)
	}
	if b.TTL != "" && !c.wire(m, base+".ttl", -1, b.TTL, wireName) {
		if _, err := ParseTTL(b.TTL); err != nil {
			c.refuse(m, base+".ttl", "%s", err)
		}
	}
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

// escapes reports whether a slash-separated relative path leaves its root.
func escapes(p string) bool {
	p = path.Clean(p)
	return p == ".." || strings.HasPrefix(p, "../")
}

func (c *checker) build(m *Manifest) {
	b := m.Build
	switch {
	case b.Repo == "":
		c.refuse(m, "build.repo", "the build has no repo: write `repo:` and the git URL (or local path) of the module's source")
	case wirePrefixed(b.Repo):
		c.refuse(m, "build.repo", "%q reads as a subject on the wire: write the git URL (or local path) of the module's source", b.Repo)
	}
	switch {
	case b.Path == "":
	case wirePrefixed(b.Path):
		c.refuse(m, "build.path", "%q reads as a subject on the wire: write the build context's directory in the repository, such as `runtime`", b.Path)
	case path.IsAbs(b.Path) || strings.Contains(b.Path, `\`):
		c.refuse(m, "build.path", "%q is not a relative path: write the directory in the repository with '/', such as %q", b.Path, strings.TrimLeft(strings.ReplaceAll(b.Path, `\`, "/"), "/"))
	case escapes(b.Path):
		c.refuse(m, "build.path", "%q leaves the repository: write a directory inside it, relative to its root", b.Path)
	}
	switch {
	case b.Dockerfile == "":
	case wirePrefixed(b.Dockerfile):
		c.refuse(m, "build.dockerfile", "%q reads as a subject on the wire: write the Dockerfile's path relative to build.path, such as `Dockerfile`", b.Dockerfile)
	case path.IsAbs(b.Dockerfile) || strings.Contains(b.Dockerfile, `\`):
		c.refuse(m, "build.dockerfile", "%q is not a relative path: write the Dockerfile's path relative to build.path with '/', such as `Dockerfile`", b.Dockerfile)
	case escapes(path.Join(b.Path, b.Dockerfile)):
		c.refuse(m, "build.dockerfile", "%q leaves the repository: write a path inside it, relative to build.path", b.Dockerfile)
	}
	for i, on := range b.On {
		if !c.name(m, "build.on", i, on, "module", wireOwner) || c.refuseDup(m, "build.on", b.On, i) {
			continue
		}
		if on == m.Module {
			c.refuse(m, field("build.on", i), "a module is not built FROM its own image: remove %q", on)
		}
	}
	for i, p := range b.Platforms {
		if c.wire(m, "build.platforms", i, p, wireName) {
			continue
		}
		if !platformRE.MatchString(p) {
			c.refuse(m, field("build.platforms", i), "%q is not a platform: write os/arch or os/arch/variant, such as %s or linux/arm64/v8", p, DefaultPlatform)
			continue
		}
		c.refuseDup(m, "build.platforms", b.Platforms, i)
	}
}

// seatRef is a seat of the catalogue and who declares it: owner is nil for
// the mesh's own seats.
type seatRef struct {
	seat  *Seat
	owner *Manifest
	index int
}

func where(m *Manifest) string {
	if m.File == "" {
		return "an earlier manifest"
	}
	return m.File
}

func (r seatRef) describe() string {
	if r.owner == nil {
		return fmt.Sprintf("the mesh's seat %s", r.seat.Seat)
	}
	return fmt.Sprintf("seat %s (declared by %s in %s)", r.seat.Seat, r.owner.Module, where(r.owner))
}

// catalogue runs the checks across manifests. Everything here is linear in
// the size of the catalogue: lookups are by map, and the build graph is
// walked once.
func (c *checker) catalogue(ms []*Manifest) {
	mods := make(map[string]*Manifest, len(ms))
	first := make([]*Manifest, 0, len(ms))
	for _, m := range ms {
		if m.Module == "" || !isName(m.Module) {
			continue
		}
		if prev, dup := mods[m.Module]; dup {
			c.refuse(m, "module", "module %q is already declared in %s: a module is declared by one manifest; remove this file or rename the module", m.Module, where(prev))
			continue
		}
		mods[m.Module] = m
		first = append(first, m)
		if _, ok := MeshSeat(m.Module); ok {
			c.refuse(m, "module", "%q is the name of the mesh's own seat, and `consumes: [%s.EVENT]` could not tell them apart: rename the module", m.Module, m.Module)
		}
	}

	seats := make(map[string]seatRef, len(MeshSeats)+len(ms))
	for i := range MeshSeats {
		seats[MeshSeats[i].Seat] = seatRef{seat: &MeshSeats[i], index: -1}
	}
	for _, m := range first {
		for i := range m.Seats {
			s := &m.Seats[i]
			if !isName(s.Seat) || strings.HasPrefix(s.Seat, "mesh-") {
				continue // refused already
			}
			if prev, dup := seats[s.Seat]; dup {
				if prev.owner != m {
					c.refuse(m, field("seats", i)+".seat", "seat %q is already declared by module %s (%s): a seat is declared by one module; to submit work to it write `uses: [%s]`, to hear its events `consumes: [%s.EVENT]`",
						s.Seat, prev.owner.Module, where(prev.owner), s.Seat, s.Seat)
				}
				continue
			}
			seats[s.Seat] = seatRef{seat: s, owner: m, index: i}
			if other, ok := mods[s.Seat]; ok {
				c.refuse(m, field("seats", i)+".seat", "seat %q has the name of module %s (%s), and `consumes: [%s.EVENT]` could not tell them apart: rename the seat, such as %q",
					s.Seat, other.Module, where(other), s.Seat, "node-"+s.Seat)
			}
		}
	}

	em := emitIndex{}
	for _, m := range first {
		c.foreign(m, "emits", m.Emits, mods, seats)
		for i, s := range m.Seats {
			c.foreign(m, field("seats", i)+".emits", s.Emits, mods, seats)
		}
		c.references(m, mods, seats, em)
	}
	c.cycles(first)
}

// foreign refuses an event that reads as another module's or a seat's.
func (c *checker) foreign(m *Manifest, base string, events []string, mods map[string]*Manifest, seats map[string]seatRef) {
	for i, e := range events {
		head, rest, ok := strings.Cut(e, ".")
		if !ok || head == m.Module || !isEvent(e) || IsLogEvent(e) {
			continue // log.* is every emitter's own, whatever modules exist
		}
		if r, isSeat := seats[head]; isSeat {
			if r.owner == m && base == field("seats", r.index)+".emits" {
				continue // refused already as the seat's own name
			}
			c.refuse(m, field(base, i), "%q reads as an event of %s: for the seat to emit it, list %q under that seat's emits; otherwise emit a local name, such as %q",
				e, r.describe(), rest, rest)
			continue
		}
		if other, isMod := mods[head]; isMod {
			c.refuse(m, field(base, i), "%q reads as an event of module %s (%s): declare a seat that emits it, or emit a local name, such as %q",
				e, other.Module, where(other), rest)
		}
	}
}

// references checks what a module names of others: consumes, reads, uses
// and build.on.
func (c *checker) references(m *Manifest, mods map[string]*Manifest, seats map[string]seatRef, em emitIndex) {
	for i, ref := range m.Consumes {
		emitter, event, ok := SplitRef(ref)
		if !ok || isWire(ref) || !isName(emitter) || event != "**" && !isEvent(event) {
			continue
		}
		if r, isSeat := seats[emitter]; isSeat {
			if !em.emits(emitter, r.seat.Emits, event) {
				c.refuse(m, field("consumes", i), "%s does not emit %q; it emits %s: consume one of those, or declare the event in the seat's emits",
					r.describe(), event, listOr(r.seat.Emits, "nothing"))
			}
			continue
		}
		other, isMod := mods[emitter]
		if !isMod || em.emits(emitter, other.Emits, event) {
			continue // an absent emitter may be installed later
		}
		hint := ""
		for _, s := range other.Seats {
			if seats[s.Seat].owner == other && matchesAny(s.Emits, event) {
				hint = fmt.Sprintf("; its seat %s does: write %q", s.Seat, s.Seat+"."+event)
				break
			}
		}
		c.refuse(m, field("consumes", i), "module %s (%s) does not emit %q; it emits %s%s: consume one of those, or declare the event in %s's emits",
			other.Module, where(other), event, listOr(other.Emits, "nothing"), hint, other.Module)
	}
	for i, ref := range m.Reads {
		owner, bucket, ok := SplitRef(ref)
		if !ok || isWire(ref) || !isName(owner) || !isName(bucket) {
			continue
		}
		other, isMod := mods[owner]
		if !isMod {
			continue
		}
		if !slices.ContainsFunc(other.State, func(b Bucket) bool { return b.Name == bucket }) {
			names := make([]string, len(other.State))
			for j, b := range other.State {
				names[j] = b.Name
			}
			c.refuse(m, field("reads", i), "module %s (%s) has no bucket %q; its state is %s: read one of those, or declare %q under that module's state",
				other.Module, where(other), bucket, listOr(names, "empty"), bucket)
		}
	}
	for i, u := range m.Uses {
		if !isName(u) {
			continue
		}
		if _, isSeat := seats[u]; isSeat {
			continue
		}
		if other, isMod := mods[u]; isMod {
			c.refuse(m, field("uses", i), "%q is a module (%s), not a seat: uses names a seat to submit work to; to hear the module's events write `consumes: [%s.EVENT]`",
				u, where(other), u)
			continue
		}
		c.warn(m, field("uses", i), "no module in the catalogue declares seat %q: if its holder comes later, work submitted to it queues until then; otherwise check the name", u)
	}
	if m.Build == nil {
		return
	}
	for i, on := range m.Build.On {
		if !isName(on) || on == m.Module {
			continue
		}
		other, ok := mods[on]
		switch {
		case !ok:
			if _, broken := c.broken[on]; !broken {
				c.refuse(m, field("build.on", i), "there is no module %q in the catalogue: build.on names modules of the catalogue whose images this one is built FROM", on)
			}
		case other.Build == nil:
			c.refuse(m, field("build.on", i), "module %s (%s) has no build, so no image to be built FROM: name a module that has one, or add a build to %s",
				on, where(other), on)
		}
	}
}

func listOr(list []string, none string) string {
	if len(list) == 0 {
		return none
	}
	return strings.Join(list, ", ")
}

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

// edge is one entry of a build.on: the module it names and its index.
type edge struct {
	to int32
	on int32
}

// cycles refuses every cycle in build.on, one problem per strongly connected
// component, printed from the component's first module by name along the
// shortest way back to it.
func (c *checker) cycles(first []*Manifest) {
	var nodes []*Manifest
	id := make(map[string]int32)
	for _, m := range first {
		if m.Build != nil {
			id[m.Module] = int32(len(nodes))
			nodes = append(nodes, m)
		}
	}
	adj := make([][]edge, len(nodes))
	for v, m := range nodes {
		for i, on := range m.Build.On {
			if w, ok := id[on]; ok && int(w) != v {
				adj[v] = append(adj[v], edge{to: w, on: int32(i)})
			}
		}
	}
	comps := components(adj)
	type report struct {
		m     *Manifest
		field string
		msg   string
	}
	var reports []report
	comp := make([]int32, len(nodes))
	for i := range comp {
		comp[i] = -1
	}
	parent := make([]edge, len(nodes))
	seen := make([]bool, len(nodes))
	for ci, members := range comps {
		start := members[0]
		for _, v := range members {
			comp[v] = int32(ci)
			if nodes[v].Module < nodes[start].Module {
				start = v
			}
		}
		// Breadth first from start, within the component, until an edge
		// leads back to it.
		queue := []int32{start}
		seen[start] = true
		var last int32 = -1
		var lastOn int32
	search:
		for len(queue) > 0 {
			u := queue[0]
			queue = queue[1:]
			for _, e := range adj[u] {
				if comp[e.to] != int32(ci) {
					continue
				}
				if e.to == start {
					last, lastOn = u, e.on
					break search
				}
				if !seen[e.to] {
					seen[e.to] = true
					parent[e.to] = edge{to: u, on: e.on}
					queue = append(queue, e.to)
				}
			}
		}
		for _, v := range members {
			seen[v] = false
		}
		if last < 0 {
			continue // cannot happen in a component of two or more
		}
		path := []int32{start}
		firstOn := lastOn
		for v := last; v != start; v = parent[v].to {
			path = append(path, v)
			if parent[v].to == start {
				firstOn = parent[v].on
			}
		}
		slices.Reverse(path[1:])
		names := make([]string, 0, len(path)+1)
		for _, v := range path {
			names = append(names, nodes[v].Module)
		}
		names = append(names, nodes[start].Module)
		reports = append(reports, report{
			m:     nodes[start],
			field: field("build.on", int(firstOn)),
			msg: fmt.Sprintf("build.on forms a cycle: %s; an image cannot be built FROM an image built FROM it: remove one of these build.on entries",
				strings.Join(names, " → ")),
		})
	}
	sort.Slice(reports, func(i, j int) bool { return reports[i].m.Module < reports[j].m.Module })
	for _, r := range reports {
		c.refuse(r.m, r.field, "%s", r.msg)
	}
}

// components returns the strongly connected components of two or more
// nodes (Tarjan's algorithm, without recursion so that a deep chain of
// build.on cannot exhaust the stack).
func components(adj [][]edge) [][]int32 {
	n := len(adj)
	index := make([]int32, n) // 0: not yet visited
	low := make([]int32, n)
	onStack := make([]bool, n)
	var (
		stack []int32
		out   [][]int32
		next  int32
	)
	type frame struct {
		v  int32
		ei int
	}
	var calls []frame
	visit := func(v int32) {
		next++
		index[v], low[v] = next, next
		stack = append(stack, v)
		onStack[v] = true
		calls = append(calls, frame{v: v})
	}
	for s := range int32(n) {
		if index[s] != 0 {
			continue
		}
		visit(s)
		for len(calls) > 0 {
			f := &calls[len(calls)-1]
			v := f.v
			if f.ei < len(adj[v]) {
				w := adj[v][f.ei].to
				f.ei++
				if index[w] == 0 {
					visit(w)
				} else if onStack[w] && index[w] < low[v] {
					low[v] = index[w]
				}
				continue
			}
			calls = calls[:len(calls)-1]
			if len(calls) > 0 {
				if u := calls[len(calls)-1].v; low[v] < low[u] {
					low[u] = low[v]
				}
			}
			if low[v] != index[v] {
				continue
			}
			k := len(stack) - 1
			for stack[k] != v {
				k--
			}
			members := stack[k:]
			for _, w := range members {
				onStack[w] = false
			}
			if len(members) > 1 {
				out = append(out, slices.Clone(members))
			}
			stack = stack[:k]
		}
	}
	return out
}
