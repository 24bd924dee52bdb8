package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/mesh"
)

func catalogueCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "catalogue", Short: "Check a catalogue and show the wire it derives"}
	c.AddCommand(&cobra.Command{
		Use:   "check DIR",
		Short: "Check every manifest in DIR; one line per problem (FILE: FIELD: message)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, warned, err := loadCatalogueWarned(g, args[0])
			if err != nil {
				return err
			}
			if warned > 0 {
				fmt.Fprintf(g.out, "%s: catalogue is clean but for %d warning(s), above on stderr\n", args[0], warned)
			} else {
				fmt.Fprintf(g.out, "%s: catalogue is clean\n", args[0])
			}
			return nil
		},
	})
	var live bool
	show := &cobra.Command{
		Use:   "show DIR",
		Short: "Show, per module and seat, the subjects, streams, consumers, buckets and permissions DIR derives",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cat, err := loadCatalogue(g, args[0])
			if err != nil {
				return err
			}
			view := DeriveView(cat)
			if live {
				if view.Orphans, err = liveOrphans(cmd.Context(), g, cat); err != nil {
					return err
				}
			}
			if g.json {
				enc := json.NewEncoder(g.out)
				enc.SetIndent("", "  ")
				return enc.Encode(view)
			}
			printView(g, view)
			return nil
		},
	}
	show.Flags().BoolVar(&live, "live", false, "also report, from the bus (--nats), what outlived its declaration: buckets, streams and consumers kept, never removed")
	c.AddCommand(show)
	c.AddCommand(&cobra.Command{
		Use:   "init DIR",
		Short: "Write the farm's own modules (build-agent, build-controller, git) into DIR, to change them; a file already there is kept",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return initCatalogue(g, args[0])
		},
	})
	return c
}

// initCatalogue writes the farm's own manifests into dir (created if
// missing), keeping any file already there.
func initCatalogue(g *globals, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("catalogue directory %s: %w", dir, err)
	}
	files := mesh.FarmManifests()
	for _, name := range slices.Sorted(maps.Keys(files)) {
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			fmt.Fprintf(g.out, "%s: kept (already there)\n", path)
			continue
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		_, werr := f.Write(files[name])
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("writing %s: %w", path, werr)
		}
		fmt.Fprintf(g.out, "%s: written\n", path)
	}
	fmt.Fprintf(g.out, "check it: builds catalogue check %s\n", dir)
	return nil
}

// loadCatalogue loads and checks a catalogue: warnings go to stderr; any
// error is printed one per line and fails the command.
func loadCatalogue(g *globals, dir string) (*mesh.Catalogue, error) {
	cat, _, err := loadCatalogueWarned(g, dir)
	return cat, err
}

// loadCatalogueWarned is loadCatalogue, and how many warnings it printed.
func loadCatalogueWarned(g *globals, dir string) (*mesh.Catalogue, int, error) {
	cat, problems, err := mesh.Load(dir)
	if err != nil {
		return nil, 0, err
	}
	warned := 0
	for _, p := range problems {
		if p.Warning {
			fmt.Fprintln(g.errw, "warning:", p.String())
			warned++
		}
	}
	if mesh.HasErrors(problems) {
		n := 0
		for _, p := range problems {
			if !p.Warning {
				fmt.Fprintln(g.out, p.String())
				n++
			}
		}
		fmt.Fprintf(g.errw, "%s: %d problem(s); fix them and run `builds catalogue check %s` again\n", dir, n, dir)
		return nil, warned, ErrFailed
	}
	return cat, warned, nil
}

// WireView is what `catalogue show` prints: the derived wire, per module and
// per seat.
type WireView struct {
	Modules []ModuleView `json:"modules"`
	Seats   []SeatView   `json:"seats"`
	Streams []StreamView `json:"streams"`
	// Principals are the sets of the processes that file no manifest: the
	// controller and an operator's builds CLI (named lists in mesh).
	Principals []mesh.Permissions `json:"principals"`
	// Orphans (with --live) are what the bus keeps whose declaration is
	// gone from DIR: reported, never removed (ADR 0201, ADR 0030).
	Orphans []string `json:"orphans,omitempty"`
}

// ModuleView is one module's derived wire.
type ModuleView struct {
	Module      string           `json:"module"`
	Publishes   []string         `json:"publishes"`
	Tools       []string         `json:"tools"`
	Consumers   []string         `json:"consumers"`
	Buckets     []string         `json:"buckets"`
	Permissions mesh.Permissions `json:"permissions"`
}

// SeatView is one seat's derived wire.
type SeatView struct {
	Seat    string   `json:"seat"`
	Owner   string   `json:"owner"`
	Holders []string `json:"holders"`
	Accepts []string `json:"accepts"`
	Events  []string `json:"events"`
	Tools   []string `json:"tools"`
	Stream  string   `json:"stream,omitempty"`
	// Consumers are the holders' consumers: one, or one per platform
	// where the seat splits by platform; AckGrants their ack grants.
	Consumers []string `json:"consumers,omitempty"`
	AckGrants []string `json:"ack_grants,omitempty"`
}

// StreamView is one stream the catalogue implies.
type StreamView struct {
	Name     string   `json:"name"`
	Subjects []string `json:"subjects"`
	Why      string   `json:"why"`
}

// DeriveView derives the wire view of a catalogue.
func DeriveView(c *mesh.Catalogue) WireView {
	var v WireView
	w := c.Derive(1)
	for _, s := range w.Streams {
		v.Streams = append(v.Streams, StreamView{Name: s.Config.Name, Subjects: s.Config.Subjects, Why: s.Why})
	}
	for _, m := range c.Modules {
		mv := ModuleView{Module: m.Module, Permissions: c.ModulePermissions(m)}
		for _, e := range m.Emits {
			mv.Publishes = append(mv.Publishes, mesh.ModuleEventSubject(m.Module, e))
		}
		for _, t := range m.Serves {
			mv.Tools = append(mv.Tools, mesh.ModuleToolSubject(m.Module, t))
		}
		for _, cs := range c.ModuleConsumerSpecs(m, 1) {
			mv.Consumers = append(mv.Consumers, cs.Stream+"/"+cs.Config.Durable+" ← "+strings.Join(cs.Config.FilterSubjects, ", "))
		}
		for _, b := range m.State {
			mv.Buckets = append(mv.Buckets, mesh.KVBucket(m.Module, b.Name))
		}
		v.Modules = append(v.Modules, mv)
	}
	for _, s := range c.Seats() {
		_, owner, _ := c.Seat(s.Seat)
		if owner == "" {
			owner = "(the mesh)"
		}
		sv := SeatView{Seat: s.Seat, Owner: owner}
		for _, h := range c.Holders(s.Seat) {
			sv.Holders = append(sv.Holders, h.Module)
		}
		for _, a := range s.Accepts {
			if acc, err := mesh.ParseAccept(a); err == nil {
				sv.Accepts = append(sv.Accepts, mesh.SeatAcceptSubject(s.Seat, acc.Verb))
			}
		}
		for _, e := range s.Emits {
			sv.Events = append(sv.Events, mesh.SeatEventSubjectOf(s, e))
		}
		for _, t := range s.Serves {
			sv.Tools = append(sv.Tools, mesh.SeatToolSubject(s.Seat, t))
		}
		if len(s.Accepts) > 0 {
			sv.Stream = mesh.SeatStream(s.Seat)
			sv.Consumers = c.HolderConsumers(s)
			sv.AckGrants = c.HolderAckGrants(s)
		}
		v.Seats = append(v.Seats, sv)
	}
	sort.Slice(v.Seats, func(i, j int) bool { return v.Seats[i].Seat < v.Seats[j].Seat })
	v.Principals = []mesh.Permissions{c.ControllerPermissions("controller"), c.OperatorPermissions("operator")}
	return v
}

func printView(g *globals, v WireView) {
	tw := tabwriter.NewWriter(g.out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tSUBJECTS\tWHY")
	for _, s := range v.Streams {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, strings.Join(s.Subjects, " "), s.Why)
	}
	tw.Flush()
	for _, s := range v.Seats {
		fmt.Fprintf(g.out, "\nseat %s (declared by %s; held by %s)\n", s.Seat, s.Owner, orNone(s.Holders))
		line(g, "accepts", s.Accepts)
		line(g, "emits", s.Events)
		line(g, "serves", s.Tools)
		if s.Stream != "" {
			fmt.Fprintf(g.out, "  queue      %s, consumers %s, ack grants %s\n", s.Stream, strings.Join(s.Consumers, ", "), strings.Join(s.AckGrants, ", "))
		}
	}
	for _, p := range v.Principals {
		fmt.Fprintf(g.out, "\nprincipal %s (files no manifest; a named list in mesh)\n", p.Principal)
		line(g, "may pub", p.Publish)
		line(g, "may sub", p.Subscribe)
	}
	printOrphans(g, v.Orphans)
	for _, m := range v.Modules {
		fmt.Fprintf(g.out, "\nmodule %s\n", m.Module)
		line(g, "publishes", m.Publishes)
		line(g, "serves", m.Tools)
		line(g, "consumers", m.Consumers)
		line(g, "buckets", m.Buckets)
		line(g, "may pub", m.Permissions.Publish)
		line(g, "may sub", m.Permissions.Subscribe)
	}
}

func line(g *globals, label string, items []string) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintf(g.out, "  %-10s %s\n", label, items[0])
	for _, it := range items[1:] {
		fmt.Fprintf(g.out, "  %-10s %s\n", "", it)
	}
}

func orNone(ss []string) string {
	if len(ss) == 0 {
		return "nobody yet"
	}
	return strings.Join(ss, ", ")
}
