package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/metrics"
)

var _ cascade.Observer = (*metrics.Controller)(nil)

func TestControllerRecordsPlans(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := metrics.NewController(reg)

	want := `
# HELP meshbuild_controller_modules_blocked Modules of the plans held that are blocked: a module they are built on failed.
# TYPE meshbuild_controller_modules_blocked gauge
meshbuild_controller_modules_blocked 0
# HELP meshbuild_controller_plans Plans the controller holds, by state: running (modules still to build) or failed (kept for a retry).
# TYPE meshbuild_controller_plans gauge
meshbuild_controller_plans{state="failed"} 0
meshbuild_controller_plans{state="running"} 0
# HELP meshbuild_controller_plans_settled_total Plans that settled, by outcome (built, failed, cancelled).
# TYPE meshbuild_controller_plans_settled_total counter
meshbuild_controller_plans_settled_total{outcome="built"} 0
meshbuild_controller_plans_settled_total{outcome="cancelled"} 0
meshbuild_controller_plans_settled_total{outcome="failed"} 0
`
	names := []string{"meshbuild_controller_modules_blocked", "meshbuild_controller_plans", "meshbuild_controller_plans_settled_total"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Errorf("before any plan: %v", err)
	}
	if n, _ := testutil.GatherAndCount(reg, "meshbuild_controller_plan_duration_seconds"); n != 3 {
		t.Errorf("%d plan duration series, want 3 (one per outcome)", n)
	}

	c.Plans(map[string]int{"running": 2, "failed": 1, "built": 1}, 3)
	c.PlanSettled("failed", 90*time.Second)
	c.PlanSettled("built", 10*time.Second)
	c.Plans(map[string]int{"running": 1}, 0) // failed and built are gone: 0
	want = `
# HELP meshbuild_controller_modules_blocked Modules of the plans held that are blocked: a module they are built on failed.
# TYPE meshbuild_controller_modules_blocked gauge
meshbuild_controller_modules_blocked 0
# HELP meshbuild_controller_plans Plans the controller holds, by state: running (modules still to build) or failed (kept for a retry).
# TYPE meshbuild_controller_plans gauge
meshbuild_controller_plans{state="built"} 0
meshbuild_controller_plans{state="failed"} 0
meshbuild_controller_plans{state="running"} 1
# HELP meshbuild_controller_plans_settled_total Plans that settled, by outcome (built, failed, cancelled).
# TYPE meshbuild_controller_plans_settled_total counter
meshbuild_controller_plans_settled_total{outcome="built"} 1
meshbuild_controller_plans_settled_total{outcome="cancelled"} 0
meshbuild_controller_plans_settled_total{outcome="failed"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Errorf("after plans: %v", err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

var _ cascade.ForecastObserver = (*metrics.Controller)(nil)

// Each running plan has its remaining-time series; a plan that settled
// (missing from the next report) loses it.
func TestControllerExportsEachRunningPlansRemainingTime(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := metrics.NewController(reg)
	const name = "meshbuild_controller_plan_remaining_seconds"
	if n, _ := testutil.GatherAndCount(reg, name); n != 0 {
		t.Errorf("%d series before any plan, want 0", n)
	}
	c.PlansRemaining(map[string]time.Duration{"p-1": 90 * time.Second, "p-2": 1500 * time.Millisecond})
	c.PlansRemaining(map[string]time.Duration{"p-1": 60 * time.Second})
	want := `
# HELP meshbuild_controller_plan_remaining_seconds Each running plan's estimated remaining time: the longer of its remaining critical path (modules' last build times, less what the building ones have done) and its remaining work over the machines. The series goes when the plan settles.
# TYPE meshbuild_controller_plan_remaining_seconds gauge
meshbuild_controller_plan_remaining_seconds{plan="p-1"} 60
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), name); err != nil {
		t.Error(err)
	}
	c.PlansRemaining(nil)
	if n, _ := testutil.GatherAndCount(reg, name); n != 0 {
		t.Errorf("%d series after every plan settled, want 0", n)
	}
}

// The held plans' modules by state: unchanged and superseded counted beside
// built (issue 24).
func TestControllerCountsModulesByState(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := metrics.NewController(reg)
	c.Modules(map[string]int{"built": 3, "unchanged": 2, "superseded": 4, "waiting": 0})
	want := `
# HELP meshbuild_controller_modules Modules of the plans the controller holds, by state: waiting, ready, queued, building, built, unchanged (its inputs were built before: not dispatched), superseded (a newer plan of its branch builds it), failed, blocked, cancelling, cancelled.
# TYPE meshbuild_controller_modules gauge
meshbuild_controller_modules{state="built"} 3
meshbuild_controller_modules{state="superseded"} 4
meshbuild_controller_modules{state="unchanged"} 2
meshbuild_controller_modules{state="waiting"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshbuild_controller_modules"); err != nil {
		t.Fatal(err)
	}
}

var _ cascade.SchedulingObserver = (*metrics.Controller)(nil)

// Each start is one observation of its wait, by priority and owner.
func TestControllerRecordsReadyToStarted(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := metrics.NewController(reg)
	c.Dispatched(10, "https://git.example/fix", 20*time.Millisecond)
	c.Dispatched(0, "https://git.example/big", 3*time.Second)
	c.Dispatched(0, "https://git.example/big", 7*time.Second)
	if n, _ := testutil.GatherAndCount(reg, "meshbuild_controller_ready_to_started_seconds"); n != 2 {
		t.Fatalf("%d series, want one per priority and owner (2)", n)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "meshbuild_controller_ready_to_started_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			h := m.GetHistogram()
			switch labels["priority"] {
			case "10":
				if h.GetSampleCount() != 1 || labels["owner"] != "https://git.example/fix" {
					t.Errorf("priority 10: %v, %d samples", labels, h.GetSampleCount())
				}
			case "0":
				if h.GetSampleCount() != 2 || h.GetSampleSum() != 10 {
					t.Errorf("priority 0: %d samples summing %v, want 2 and 10s", h.GetSampleCount(), h.GetSampleSum())
				}
			default:
				t.Errorf("series %v", labels)
			}
		}
	}
}
