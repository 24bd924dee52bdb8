package cascade_test

import (
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// planDriver makes plans on a real bed, as an operator and mesh-git do —
// a rebuild of base, a push of files to the fleet's repository — and
// waits for each to settle built.
type planDriver struct {
	t      *testing.T
	bed    *cascadetest.Bed
	module string // the controller's module
	store  *cascade.Store
}

func newPlanDriver(t *testing.T, bed *cascadetest.Bed, module string) *planDriver {
	t.Helper()
	store, err := cascade.OpenStore(bed.Ctx, bed.JS, module)
	if err != nil {
		t.Fatal(err)
	}
	return &planDriver{t: t, bed: bed, module: module, store: store}
}

// settle waits for plan to settle, fails the test unless it is built, and
// returns its modules.
func (d *planDriver) settle(plan string) map[string]cascade.ModuleStatus {
	d.t.Helper()
	testenv.WaitFor(d.t, 3*time.Minute, "plan "+plan+" to settle", func() bool {
		rec, err := d.store.Plan(d.bed.Ctx, plan)
		return err == nil && rec.Outcome != cascade.OutcomeRunning
	})
	mods, err := d.store.Modules(d.bed.Ctx, plan)
	if err != nil {
		d.t.Fatal(err)
	}
	if rec, _ := d.store.Plan(d.bed.Ctx, plan); rec.Outcome != cascade.OutcomeBuilt {
		var failed []string
		for name, m := range mods {
			if m.State == cascade.Failed {
				failed = append(failed, name+": "+m.Reason+" "+m.Message)
			}
		}
		d.t.Fatalf("plan %s: %s %+v; failed: %q", plan, rec.Outcome, rec.Counts, failed)
	}
	return mods
}

// rebuild rebuilds base (with force, whatever its key) as plan r-<id>.
func (d *planDriver) rebuild(id string, force bool) map[string]cascade.ModuleStatus {
	d.t.Helper()
	r, err := cascade.Call(d.bed.Ctx, d.bed.NC, d.module, cascade.ToolRebuild, cascade.Request{ID: id, Modules: []string{"base"}, Force: force})
	if err != nil {
		d.t.Fatal(err)
	}
	return d.settle(r.Plan)
}

// push commits files to the fleet's repository, announces the push with
// their paths and returns its plan once settled.
func (d *planDriver) push(files map[string]string) (string, map[string]cascade.ModuleStatus) {
	d.t.Helper()
	commit := testenv.Commit(d.t, d.bed.Git, files)
	var paths []string
	for p := range files {
		paths = append(paths, p)
	}
	id, _, err := cascade.Push(d.bed.Ctx, d.bed.JS, mesh.Pushed{Repo: meshtest.FleetRepo, Commit: commit, Ref: "refs/heads/main", Paths: paths})
	if err != nil {
		d.t.Fatal(err)
	}
	return id, d.settle(id)
}
