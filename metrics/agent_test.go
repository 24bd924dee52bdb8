package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/metrics"
)

var _ agent.Observer = (*metrics.Agent)(nil)

func TestAgentCountsEveryOutcome(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := metrics.NewAgent(reg, "m1")

	a.IdleWaited(300 * time.Millisecond)
	a.Began()
	inFlight := `
# HELP meshbuild_agent_asks_in_flight Asks an agent is working on now (at most its slots).
# TYPE meshbuild_agent_asks_in_flight gauge
meshbuild_agent_asks_in_flight{machine="m1"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(inFlight), "meshbuild_agent_asks_in_flight"); err != nil {
		t.Fatalf("after Began: %v", err)
	}
	a.Ended(agent.End{Outcome: agent.OutcomeBuilt, Took: 3 * time.Second, Bytes: 1 << 20, CacheHits: 4})
	a.Began()
	a.Ended(agent.End{Outcome: agent.OutcomeFailed, Reason: mesh.ReasonBuild, Took: 800 * time.Millisecond, CacheHits: 2})
	a.Began()
	a.Ended(agent.End{Outcome: agent.OutcomeRetried, Reason: mesh.ReasonInfra, Took: 200 * time.Millisecond})
	// A malformed ask begins and is refused at once.
	a.Began()
	a.Ended(agent.End{Outcome: agent.OutcomeFailed, Reason: mesh.ReasonAsk})

	want := `
# HELP meshbuild_agent_asks_in_flight Asks an agent is working on now (at most its slots).
# TYPE meshbuild_agent_asks_in_flight gauge
meshbuild_agent_asks_in_flight{machine="m1"} 0
# HELP meshbuild_agent_builds_total Asks an agent finished, by outcome (built, failed, retried, handed-back, already-done) and failure reason (source, build, push, infra, ask, cancelled; empty unless failed or retried).
# TYPE meshbuild_agent_builds_total counter
meshbuild_agent_builds_total{machine="m1",outcome="already-done",reason=""} 0
meshbuild_agent_builds_total{machine="m1",outcome="built",reason=""} 1
meshbuild_agent_builds_total{machine="m1",outcome="failed",reason="ask"} 1
meshbuild_agent_builds_total{machine="m1",outcome="failed",reason="build"} 1
meshbuild_agent_builds_total{machine="m1",outcome="failed",reason="cancelled"} 0
meshbuild_agent_builds_total{machine="m1",outcome="failed",reason="infra"} 0
meshbuild_agent_builds_total{machine="m1",outcome="failed",reason="push"} 0
meshbuild_agent_builds_total{machine="m1",outcome="failed",reason="source"} 0
meshbuild_agent_builds_total{machine="m1",outcome="handed-back",reason=""} 0
meshbuild_agent_builds_total{machine="m1",outcome="retried",reason="infra"} 1
# HELP meshbuild_agent_cache_hits_total Build steps an agent found in the build cache.
# TYPE meshbuild_agent_cache_hits_total counter
meshbuild_agent_cache_hits_total{machine="m1"} 6
# HELP meshbuild_agent_pushed_bytes_total Bytes of image an agent pushed to the registry.
# TYPE meshbuild_agent_pushed_bytes_total counter
meshbuild_agent_pushed_bytes_total{machine="m1"} 1.048576e+06
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"meshbuild_agent_asks_in_flight", "meshbuild_agent_builds_total",
		"meshbuild_agent_cache_hits_total", "meshbuild_agent_pushed_bytes_total"); err != nil {
		t.Error(err)
	}

	hist := map[string]uint64{}
	var idle uint64
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "meshbuild_agent_build_duration_seconds":
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" {
						hist[l.GetValue()] = m.GetHistogram().GetSampleCount()
					}
				}
			case "meshbuild_agent_idle_wait_seconds":
				idle = m.GetHistogram().GetSampleCount()
			}
		}
	}
	wantHist := map[string]uint64{"built": 1, "failed": 1, "retried": 1, "handed-back": 0}
	for o, n := range wantHist {
		if hist[o] != n {
			t.Errorf("build duration %s: %d observations, want %d (all: %v)", o, hist[o], n, hist)
		}
	}
	if idle != 1 {
		t.Errorf("idle wait: %d observations, want 1", idle)
	}
}

func TestAgentSeriesExistFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics.NewAgent(reg, "m1")
	for name, want := range map[string]int{
		"meshbuild_agent_builds_total":           10, // built, handed-back, already-done, retried{infra}, failed × 6 reasons
		"meshbuild_agent_build_duration_seconds": 5,  // one per outcome
		"meshbuild_agent_asks_in_flight":         1,
		"meshbuild_agent_healthy":                1,
		"meshbuild_agent_idle_wait_seconds":      1,
		"meshbuild_agent_pushed_bytes_total":     1,
		"meshbuild_agent_cache_hits_total":       1,
	} {
		if got, err := testutil.GatherAndCount(reg, name); err != nil || got != want {
			t.Errorf("%s: %d series (%v), want %d", name, got, err, want)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestAgentsOfSeveralMachinesShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	m1, m2 := metrics.NewAgent(reg, "m1"), metrics.NewAgent(reg, "m2")
	m1.Began()
	m1.Ended(agent.End{Outcome: agent.OutcomeBuilt, Took: time.Second})
	m2.Began()
	want := `
# HELP meshbuild_agent_asks_in_flight Asks an agent is working on now (at most its slots).
# TYPE meshbuild_agent_asks_in_flight gauge
meshbuild_agent_asks_in_flight{machine="m1"} 0
meshbuild_agent_asks_in_flight{machine="m2"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "meshbuild_agent_asks_in_flight"); err != nil {
		t.Error(err)
	}
	if n, _ := testutil.GatherAndCount(reg, "meshbuild_agent_builds_total"); n != 20 {
		t.Errorf("%d builds_total series for two machines, want 20", n)
	}
	defer func() {
		if recover() == nil {
			t.Error("a second agent of machine m1 on the same registry was registered; want a panic")
		}
	}()
	metrics.NewAgent(reg, "m1")
}
