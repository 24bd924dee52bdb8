package daemon_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return string(body)
}

func TestServeMetrics(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if addr, err := daemon.ServeMetrics(ctx, "", prometheus.NewRegistry(), nil); addr != "" || err != nil {
		t.Fatalf("no address: %q, %v; want nothing served", addr, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "x_total", Help: "x"}))
	addr, err := daemon.ServeMetrics(ctx, "127.0.0.1:0", reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := get(t, "http://"+addr+"/metrics"); !strings.Contains(body, "x_total 0") {
		t.Fatalf("/metrics:\n%s", body)
	}
}

func TestAgentAndControllerMetrics(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if obs, err := daemon.AgentMetrics(ctx, "", "m1", nil); obs != nil || err != nil {
		t.Fatalf("agent without an address: %v, %v; want no observer", obs, err)
	}
	agentAddr := testenv.FreeAddr(t)
	obs, err := daemon.AgentMetrics(ctx, agentAddr, "m1", nil)
	if err != nil || obs == nil {
		t.Fatalf("agent metrics: %v, %v", obs, err)
	}
	obs.Began()
	abody := get(t, "http://"+agentAddr+"/metrics")
	for _, want := range []string{
		`meshbuild_agent_asks_in_flight{machine="m1"} 1`,
		`meshbuild_agent_builds_total`, // declared, no build ended yet
		"go_goroutines", "process_cpu_seconds_total",
	} {
		if !strings.Contains(abody, want) {
			t.Errorf("agent /metrics lacks %s", want)
		}
	}

	s := natstest.Server(t, nil)
	if cobs, err := daemon.ControllerMetrics(ctx, "", s.ClientURL(), "", nil); cobs != nil || err != nil {
		t.Fatalf("controller without an address: %v, %v; want no observer", cobs, err)
	}
	addr := testenv.FreeAddr(t)
	cobs, err := daemon.ControllerMetrics(ctx, addr, s.ClientURL(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	cobs.Plans(map[string]int{"running": 2}, 1)
	// The controller's observer is the fleet's too: RunController hands
	// it to the fleet's side.
	fleet, ok := cobs.(deploy.Observer)
	if !ok {
		t.Fatalf("the controller's observer %T is no deploy.Observer: the fleet's metrics would not be served", cobs)
	}
	fleet.NodeSeen("n1", 3, 2, time.Now())
	body := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{
		`meshbuild_controller_plans{state="running"} 2`,
		`meshbuild_controller_node_declared_revision{node="n1"} 3`,
		`meshbuild_controller_node_applied_revision{node="n1"} 2`,
		`meshbuild_queue_up{seat="` + mesh.BuildSeat + `"} 0`, // nothing raised
		"go_goroutines", "process_cpu_seconds_total",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("controller /metrics lacks %s", want)
		}
	}
}

// TestNodeMetrics: mesh-node serves the node's own series and those of
// the build agent it carries on one address.
func TestNodeMetrics(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if aobs, nobs, err := daemon.NodeMetrics(ctx, "", "n1", nil); aobs != nil || nobs != nil || err != nil {
		t.Fatalf("node without an address: %v, %v, %v; want no observers", aobs, nobs, err)
	}
	addr := testenv.FreeAddr(t)
	aobs, nobs, err := daemon.NodeMetrics(ctx, addr, "n1", nil)
	if err != nil || aobs == nil || nobs == nil {
		t.Fatalf("node metrics: %v, %v, %v", aobs, nobs, err)
	}
	nobs.Revisions(5, 3)
	aobs.Began()
	body := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{
		`meshbuild_node_revision_lag{node="n1"} 2`,
		`meshbuild_node_applies_total{node="n1",outcome="failed"} 0`,
		`meshbuild_agent_asks_in_flight{machine="n1"} 1`,
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("node /metrics lacks %s", want)
		}
	}
}
