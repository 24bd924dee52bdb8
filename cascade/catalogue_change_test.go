package cascade_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// catalogueOf is the mesh's own modules and these: a, and b and c built on
// it, b for the platforms given (none: the default).
func catalogueOf(t *testing.T, b []string, withB bool) *mesh.Catalogue {
	t.Helper()
	ms := meshtest.MeshManifests(t)
	ms = append(ms,
		&mesh.Manifest{Module: "a", Build: &mesh.Build{Repo: meshtest.FleetRepo, Path: "a"}},
		&mesh.Manifest{Module: "c", Build: &mesh.Build{Repo: meshtest.FleetRepo, Path: "c", On: []string{"a"}}})
	if withB {
		ms = append(ms, &mesh.Manifest{Module: "b", Build: &mesh.Build{Repo: meshtest.FleetRepo, Path: "b", On: []string{"a"}, Platforms: b}})
	}
	if ps := mesh.Check(ms); mesh.HasErrors(ps) {
		t.Fatalf("test catalogue has problems: %v", ps)
	}
	return mesh.NewCatalogue(ms)
}

// A catalogue changed while a plan runs: a module of the plan taken out
// of it, or the only module built for a platform no longer built for it
// (the seat's queue then has no subject for that platform). Its ask would
// be refused by the bus, and the controller retried it in every flush
// while every plan waited (seen by hand: `builds up`, a module's manifest
// removed while its base built; the plan never settled, nor did a plan
// pushed after it). Now the module fails, saying why, what it blocks is
// blocked, and the rest of the plan is built.
func TestAModuleTheCatalogueNoLongerBuildsFailsInsteadOfStallingTheController(t *testing.T) {
	for _, tc := range []struct {
		name string
		next *mesh.Catalogue
		want string
	}{
		{"removed", catalogueOf(t, nil, false), "b is no longer in the catalogue"},
		{"platform dropped", catalogueOf(t, nil, true), "the catalogue no longer builds b for linux/386"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessOf(t, catalogueOf(t, []string{"linux/386"}, true), 1)
			h.w.sleep["a"] = 2 * time.Second
			plan := h.push("c0ffee", "push-"+tc.name)
			// While a builds, the catalogue changes (raised: the queue
			// loses linux/386's subject when no module builds for it).
			testenv.WaitFor(t, 10*time.Second, "a to start", func() bool { return len(h.w.asksOf("a")) > 0 })
			if err := h.c.SetCatalogue(context.Background(), tc.next); err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			rec, mods := h.settle(plan, 20*time.Second)
			if took := time.Since(began); took > 10*time.Second {
				t.Errorf("the plan settled %s after the change; want well within the flush's retry bound", took)
			}
			if mods["c"].State != cascade.Built {
				t.Errorf("c %s, want built", mods["c"].State)
			}
			b := mods["b"]
			if b.State != cascade.Failed || b.Reason != mesh.ReasonAsk || !strings.Contains(b.Message, tc.want) {
				t.Errorf("b %s (%s): %q; want failed (ask) saying %q", b.State, b.Reason, b.Message, tc.want)
			}
			if rec.Outcome != cascade.OutcomeFailed {
				t.Errorf("plan %s, want failed", rec.Outcome)
			}
			// The controller goes on: a plan pushed after builds.
			h.w.sleep["a"] = 0
			next := h.push("decaf", "push2-"+tc.name)
			if rec, _ := h.settle(next, 20*time.Second); rec.Outcome != cascade.OutcomeBuilt {
				t.Errorf("the next plan %s, want built", rec.Outcome)
			}
		})
	}
}
