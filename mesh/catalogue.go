package mesh

import (
	"sort"
	"strings"
)

// Catalogue is a checked set of manifests plus the mesh's own seats.
type Catalogue struct {
	// Dir is the directory the catalogue was loaded from, if any.
	Dir string
	// Modules are the catalogue's manifests, sorted by module name.
	Modules []*Manifest

	byName    map[string]*Manifest
	seatOwner map[string]string // seat -> declaring module; "" for the mesh's own
	seats     map[string]Seat
}

// NewCatalogue indexes manifests without checking them; Load checks.
// Where two manifests declare the same module or seat, the first wins.
func NewCatalogue(manifests []*Manifest) *Catalogue {
	c := &Catalogue{
		byName:    map[string]*Manifest{},
		seatOwner: map[string]string{},
		seats:     map[string]Seat{},
	}
	for _, s := range MeshSeats {
		c.seatOwner[s.Seat] = ""
		c.seats[s.Seat] = s
	}
	for _, m := range manifests {
		if _, dup := c.byName[m.Module]; dup {
			continue
		}
		c.byName[m.Module] = m
		c.Modules = append(c.Modules, m)
		for _, s := range m.Seats {
			if _, dup := c.seats[s.Seat]; dup {
				continue
			}
			c.seatOwner[s.Seat] = m.Module
			c.seats[s.Seat] = s
		}
	}
	sort.Slice(c.Modules, func(i, j int) bool { return c.Modules[i].Module < c.Modules[j].Module })
	return c
}

// Module returns a module by name.
func (c *Catalogue) Module(name string) (*Manifest, bool) {
	m, ok := c.byName[name]
	return m, ok
}

// Seat returns a seat by name and the module that declares it ("" for the
// mesh's own seats).
func (c *Catalogue) Seat(name string) (seat Seat, owner string, ok bool) {
	s, ok := c.seats[name]
	return s, c.seatOwner[name], ok
}

// Seats returns every seat — the mesh's own and the catalogue's — sorted by name.
func (c *Catalogue) Seats() []Seat {
	out := make([]Seat, 0, len(c.seats))
	for _, s := range c.seats {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seat < out[j].Seat })
	return out
}

// Built returns the modules that are built into an image, sorted by name.
func (c *Catalogue) Built() []*Manifest {
	var out []*Manifest
	for _, m := range c.Modules {
		if m.Build != nil {
			out = append(out, m)
		}
	}
	return out
}

// Holders returns the modules that hold seat s: the module that declares it,
// and, for a mesh seat, every module with holds naming it.
func (c *Catalogue) Holders(seat string) []*Manifest {
	var out []*Manifest
	for _, m := range c.Modules {
		if m.HoldsSeat(seat) {
			out = append(out, m)
		}
	}
	return out
}

// HoldsSeat reports whether the module declares or is assigned seat s.
func (m *Manifest) HoldsSeat(seat string) bool {
	for _, s := range m.Seats {
		if s.Seat == seat {
			return true
		}
	}
	for _, h := range m.Holds {
		if h == seat {
			return true
		}
	}
	return false
}

// HeldSeats returns every seat the module holds (declared or assigned), the
// mesh's own resolved from MeshSeats.
func (c *Catalogue) HeldSeats(m *Manifest) []Seat {
	out := append([]Seat(nil), m.Seats...)
	for _, h := range m.Holds {
		if s, _, ok := c.Seat(h); ok {
			out = append(out, s)
		}
	}
	return out
}

// SplitRef splits a reference of the form "<owner>.<name>" (a consumes or a
// reads entry) at its first dot.
func SplitRef(ref string) (owner, name string, ok bool) {
	owner, name, ok = strings.Cut(ref, ".")
	return owner, name, ok && owner != "" && name != ""
}

// ConsumedSubject derives the subject of a consumes entry "<emitter>.<event>":
// a seat's event when the emitter is a seat (the mesh's own or one declared
// in the catalogue), a module's event otherwise.
func (c *Catalogue) ConsumedSubject(ref string) (string, bool) {
	emitter, event, ok := SplitRef(ref)
	if !ok {
		return "", false
	}
	if s, _, isSeat := c.Seat(emitter); isSeat {
		return SeatEventSubjectOf(s, event), true
	}
	return ModuleEventSubject(emitter, event), true
}
