package mesh

// The checks of one manifest on its own: its module, seats, buckets, events
// and build section.

import (
	"path"
	"sort"
	"strings"
)

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
	c.holds(m)
	for i, e := range m.Emits {
		c.emitted(m, "emits", i, m.Emits, e, "")
	}
	c.consumeRefs(m)
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
	c.readRefs(m)
}

// holds checks that each seat m holds is one of the mesh's own.
func (c *checker) holds(m *Manifest) {
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
}

// consumeRefs checks the form of each event m consumes.
func (c *checker) consumeRefs(m *Manifest) {
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
}

// readRefs checks the form of each bucket m reads.
func (c *checker) readRefs(m *Manifest) {
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
			c.refuse(m, base+".seat", "%q: the mesh-* prefix is the mesh's own (its seats are %s; to hold one write `holds: [mesh-git]`): name the module's own seat without it, such as %q", s.Seat, meshSeatNames(), own)
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
	switch {
	case s.Shards == 0:
	case !SplitsByPlatform(s.Seat):
		c.refuse(m, base+".shards", "only the build seat (%s) splits its queue into shards: remove `shards`", BuildSeat)
	case s.Shards < 1 || s.Shards > MaxShards:
		c.refuse(m, base+".shards", "shards %d: write 1 to %d, one for each %d machine slots or so (mesh.FleetSettingsOf)", s.Shards, MaxShards, ShardPulls)
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
	switch b.Compression {
	case "", CompressionGzip, CompressionZstd:
	default:
		c.refuse(m, "build.compression", "%q is not a layer compression: write %s (the default) or %s", b.Compression, CompressionGzip, CompressionZstd)
	}
	c.priority(m)
}
