package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
)

// TestWatchAndPlansCountUnchangedModules: a plan whose modules settle
// unchanged (their inputs were built before) is settled for `builds watch`,
// which ends, exits 0 and says how many were unchanged; `builds plans` has
// a column for them. (The watch did not count unchanged as finished and
// followed such a plan for ever.)
func TestWatchAndPlansCountUnchangedModules(t *testing.T) {
	s, st := cascadetest.PlanStore(t)
	ctx := context.Background()
	if err := st.Put(ctx, map[string]any{
		cascade.PlanKey("p1"): cascade.PlanRecord{ID: "p1", Outcome: cascade.OutcomeBuilt, Counts: cascade.Counts{Built: 1, Unchanged: 2, Total: 3}},
		cascade.ModuleKey("p1", "base"): cascade.ModuleStatus{Module: "base", State: cascade.Built, On: "m1",
			Digest: "sha256:1111111111111111111111111111111111111111111111111111111111111111"},
		cascade.ModuleKey("p1", "app"): cascade.ModuleStatus{Module: "app", State: cascade.Unchanged, Reuses: "p0",
			Digest: "sha256:2222222222222222222222222222222222222222222222222222222222222222"},
		cascade.ModuleKey("p1", "web"): cascade.ModuleStatus{Module: "web", State: cascade.Unchanged, Reuses: "p0",
			Digest: "sha256:3333333333333333333333333333333333333333333333333333333333333333"},
		cascade.PlanKey("p0"): cascade.PlanRecord{ID: "p0", Outcome: cascade.OutcomeBuilt, Counts: cascade.Counts{Unchanged: 1, Total: 1}},
		cascade.ModuleKey("p0", "app"): cascade.ModuleStatus{Module: "app", State: cascade.Unchanged, Reuses: "p-1",
			Digest: "sha256:2222222222222222222222222222222222222222222222222222222222222222"},
	}); err != nil {
		t.Fatal(err)
	}
	code, out, errw := run(t, "--nats", s.ClientURL(), "watch", "p1")
	if code != 0 {
		t.Fatalf("builds watch of a plan built with unchanged modules: exit %d\n%s\n%s", code, out, errw)
	}
	for _, want := range []string{"1/3 built, 2 unchanged", "reuses p0"} {
		if !strings.Contains(out, want) {
			t.Errorf("builds watch does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(errw, "--force") {
		t.Errorf("builds watch of a plan that built a module says nothing was built: %q", errw)
	}
	// A plan whose every module is unchanged says how to build again.
	if code, _, errw := run(t, "--nats", s.ClientURL(), "watch", "p0"); code != 0 || !strings.Contains(errw, "rebuild --force") {
		t.Errorf("builds watch of a plan whose every module is unchanged: exit %d, stderr %q: want 0 and how to build again", code, errw)
	}
	code, out, errw = run(t, "--nats", s.ClientURL(), "plans")
	if code != 0 {
		t.Fatalf("builds plans: exit %d: %s", code, errw)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var row []string
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "p1" {
			row = f
		}
	}
	head := strings.Fields(lines[0])
	col := -1
	for i, h := range head {
		if h == "UNCHANGED" {
			col = i
		}
	}
	if col < 0 || col >= len(row) || row[col] != "2" || row[col-1] != "1" {
		t.Errorf("builds plans: want BUILT 1 and UNCHANGED 2:\n%s", out)
	}
}
