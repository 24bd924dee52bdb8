package cascade_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// A controller whose store has no estimates (its first start, or a store
// lost) reads the agents' build records (build-agent.builds, which its
// manifest reads) and ranks asks by the newest build any machine recorded
// of each module: a running plan's forecast carries those times; an older
// record and a failure teach nothing.
func TestAControllerWithoutEstimatesLearnsThemFromTheAgentsRecords(t *testing.T) {
	h := newHarness(t, map[string][]string{"a": nil, "b": {"a"}, "c": {"b"}}, 1)
	h.w.sleep["a"] = 3 * time.Second
	h.stopControllerNow()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := h.js.KeyValue(ctx, mesh.KVBucket(mesh.AgentModule, mesh.AgentBuildsBucket))
	if err != nil {
		t.Fatalf("the agents' bucket is not raised: %v", err)
	}
	now := time.Now().UTC()
	for _, r := range []mesh.BuildRecord{
		{Module: "a", Machine: "m1", Outcome: mesh.EventBuilt, Duration: 7 * time.Second, At: now},
		{Module: "a", Machine: "m2", Outcome: mesh.EventBuilt, Duration: 70 * time.Second, At: now.Add(-time.Hour)},
		{Module: "b", Machine: "m2", Outcome: mesh.EventBuilt, Duration: 5 * time.Second, At: now},
		{Module: "c", Machine: "m1", Outcome: mesh.EventFailed, Duration: 50 * time.Second, At: now},
	} {
		data, _ := json.Marshal(r)
		if _, err := kv.Put(ctx, mesh.BuildRecordKey(r.Module, r.Machine), data); err != nil {
			t.Fatal(err)
		}
	}
	if est, err := h.store().Estimates(ctx); err != nil || len(est) != 0 {
		t.Fatalf("the store's estimates: %v, %v; want none", est, err)
	}
	h.startController()
	plan := h.push("c1", "push-c1")
	f := h.forecastHolding(plan, "a")
	want := map[string]time.Duration{"a": 7 * time.Second, "b": 5 * time.Second}
	if len(f.Path) != 3 || f.Unknown {
		t.Fatalf("forecast %+v: want the path a → b → c, with estimates", f)
	}
	for _, step := range f.Path {
		if d, ok := want[step.Module]; ok && (step.Estimate != d || step.Guessed) {
			t.Errorf("%s: estimate %s (guessed %v), want %s from the agents' records", step.Module, step.Estimate, step.Guessed, d)
		}
		if step.Module == "c" && !step.Guessed {
			t.Errorf("c: estimate %s, want none of its own (its only record is a failure)", step.Estimate)
		}
	}
	h.settle(plan, 30*time.Second)
}

// A module's first build writes no estimate key: its current record
// carries the build's duration, and a restarted controller ranks and
// forecasts by it (no agent records here to learn from instead).
func TestAFirstBuildsEstimateRidesInItsCurrentRecord(t *testing.T) {
	h := newHarness(t, map[string][]string{"a": nil, "b": {"a"}}, 1)
	h.w.sleep["a"] = 2 * time.Second
	h.w.sleep["b"] = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h.settle(h.push("c1", "push-c1"), 30*time.Second)
	if est, err := h.store().Estimates(ctx); err != nil || len(est) != 0 {
		t.Fatalf("estimate keys after the first builds: %v, %v; want none", est, err)
	}
	cur, err := h.store().Currents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cur["a"].Duration < 2*time.Second || cur["b"].Duration < 300*time.Millisecond {
		t.Fatalf("current records a %+v, b %+v: want each carrying its build's duration", cur["a"], cur["b"])
	}

	h.stopControllerNow()
	h.startController()
	plan := h.push("c2", "push-c2")
	f := h.forecastHolding(plan, "a")
	for _, step := range f.Path {
		if d := cur[step.Module].Duration; step.Estimate != d || step.Guessed {
			t.Errorf("%s: estimate %s (guessed %v), want %s from its current record", step.Module, step.Estimate, step.Guessed, d)
		}
	}
	h.settle(plan, 30*time.Second)
}

// forecastHolding waits for a running plan's forecast to name module as
// the building it holds on, and returns that forecast.
func (h *harness) forecastHolding(plan, module string) *cascade.Forecast {
	h.t.Helper()
	var f *cascade.Forecast
	testenv.WaitFor(h.t, 20*time.Second, "the running plan's forecast to name "+module+" building", func() bool {
		r, err := h.store().Plan(context.Background(), plan)
		if err != nil || r.Forecast == nil {
			return false
		}
		f = r.Forecast
		hold, ok := f.Holding()
		return ok && hold.Module == module && hold.State == cascade.Building
	})
	return f
}
