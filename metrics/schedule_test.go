package metrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/metrics"
)

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
