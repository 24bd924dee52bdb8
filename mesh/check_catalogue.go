package mesh

// The checks across manifests: one declarer per module and seat, and every
// reference (consumes, reads, uses, holds, build.on) to something declared.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/platforms"
)

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
	c.consumes(m, mods, seats, em)
	c.reads(m, mods)
	c.uses(m, mods, seats)
	c.buildOn(m, mods)
}

// consumes checks that each event m consumes is emitted by the seat or
// module it names (an emitter not in the catalogue may come later).
func (c *checker) consumes(m *Manifest, mods map[string]*Manifest, seats map[string]seatRef, em emitIndex) {
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
}

// reads checks that each bucket m reads is in its owner's state.
func (c *checker) reads(m *Manifest, mods map[string]*Manifest) {
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
}

// uses checks that what m uses is a seat, not a module.
func (c *checker) uses(m *Manifest, mods map[string]*Manifest, seats map[string]seatRef) {
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
}

// buildOn checks that each module m is built on is in the catalogue and
// builds an image.
func (c *checker) buildOn(m *Manifest, mods map[string]*Manifest) {
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
		case dup(m.Build.On, i) < 0:
			c.basePlatforms(m, i, other)
		}
	}
}

// basePlatforms warns when m is built for a platform that its base
// (build.on[i]) is not built for, nor for any platform a machine of it
// runs (containerd's platforms.Only: linux/amd64 runs linux/386): that
// image of m is built FROM the base's image of another platform, whose
// executables it cannot run. BuildKit does not check the platform of a
// base given as a named context, as the farm gives every base (docker
// build warns of it, InvalidBaseImagePlatform, for an image it pulls),
// so nothing else would say so. A warning, not a refusal: a base that
// carries only files serves every platform.
func (c *checker) basePlatforms(m *Manifest, i int, base *Manifest) {
	var missing []string
	theirs := base.Build.PlatformsOrDefault()
	for _, p := range m.Build.PlatformsOrDefault() {
		if slices.Contains(theirs, p) {
			continue // as most are: no parse
		}
		spec, err := platforms.Parse(p)
		if err != nil {
			continue // the manifest's own check refuses it
		}
		runs := platforms.Only(spec)
		if !slices.ContainsFunc(theirs, func(q string) bool {
			bs, err := platforms.Parse(q)
			return err == nil && runs.Match(bs)
		}) {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return
	}
	these, have := strings.Join(missing, ", "), strings.Join(theirs, ", ")
	c.warn(m, field("build.on", i), "%s is built for %s, its base %s (%s) only for %s: %s's %s image would be built FROM %s's %s image, "+
		"whose programs it cannot run (BuildKit does not check a base's platform): add %s to %s's build.platforms, or leave it so if %s carries only files",
		m.Module, these, base.Module, where(base), have, m.Module, these, base.Module, have, these, base.Module, base.Module)
}
