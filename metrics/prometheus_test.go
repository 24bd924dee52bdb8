package metrics_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/metrics"
	"github.com/meshbuild/meshbuild/metrics/metricstest"
	"github.com/meshbuild/meshbuild/planner"
)

// TestDashboardsAgainstARealPrometheus runs a small farm in-process — a
// real NATS server, the real controller and two real agents whose worker
// sleeps instead of building — each serving its own /metrics, lets a real
// Prometheus scrape them while a plan with one failing module runs, and
// then asks that Prometheus every query of every dashboard panel: each must
// return a series with a value. (cmd/internal/demo's TestDashboardsOnBuildsUp
// does the same against the real farm of builds up.)
func TestDashboardsAgainstARealPrometheus(t *testing.T) {
	testenv.RequirePrometheus(t)
	began := time.Now()

	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	graph := map[string][]string{"base": nil, "runtime": {"base"}, "web": {"base"}, "tool": {"base"}, "tool-cli": {"tool"}}
	cat := meshtest.Catalogue(t, graph)
	w := &sleepy{sleep: map[string]time.Duration{"base": 400 * time.Millisecond, "runtime": 700 * time.Millisecond,
		"web": 300 * time.Millisecond, "tool": 500 * time.Millisecond}, fail: map[string]bool{"tool": true}}

	// The controller's process: its plans, the build seat's queue and the
	// fleet of nodes.
	creg := prometheus.NewRegistry()
	cobs := metrics.NewController(creg)
	creg.MustRegister(metrics.NewQueueCollector(js, []string{mesh.BuildSeat}))
	startController(t, s, cat, cobs)
	startFleet(t, s, cat, deploy.NewMetrics(creg, ""))
	targets := map[string]string{"controller": metricstest.Serve(t, creg)}

	// A node's process (mesh-node), its own registry: it applies web.
	nreg := prometheus.NewRegistry()
	startNode(t, s, "n1", deploy.NewMetrics(nreg, "n1"))
	targets["n1"] = metricstest.Serve(t, nreg)
	if _, err := deploy.Call(context.Background(), js.Conn(), mesh.AssignTool, deploy.Request{Module: "web", Nodes: []string{"n1"}}); err != nil {
		t.Fatal(err)
	}

	// Two agents' processes, one registry each.
	for _, m := range []string{"m1", "m2"} {
		reg := prometheus.NewRegistry()
		startAgent(t, s, m, w, metrics.NewAgent(reg, m))
		targets[m] = metricstest.Serve(t, reg)
	}

	t.Logf("farm up in %s", time.Since(began).Round(time.Millisecond))
	ctx := testCtx(t)
	prom := testenv.Prometheus(t, []string{targets["controller"], targets["m1"], targets["m2"], targets["n1"]})
	t.Logf("Prometheus ready %s after the start", time.Since(began).Round(time.Millisecond))
	prom.WaitUp(ctx, 20*time.Second)
	t.Logf("every target scraped %s after the start", time.Since(began).Round(time.Millisecond))

	// A plan: three modules built, one failed (tool), one blocked (tool-cli).
	plan := push(t, js, "c1")
	st, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
	var rec cascade.PlanRecord
	testenv.WaitFor(t, 20*time.Second, "the plan to settle", func() bool {
		rec, err = st.Plan(context.Background(), plan)
		return err == nil && rec.Outcome != cascade.OutcomeRunning
	})
	if rec.Outcome != cascade.OutcomeFailed || rec.Counts.Built != 3 || rec.Counts.Failed != 1 || rec.Counts.Blocked != 1 {
		t.Fatalf("plan %+v: want 3 built, tool failed, tool-cli blocked", rec)
	}
	t.Logf("plan settled %s after the start", time.Since(began).Round(time.Millisecond))

	// rate() needs two samples in its window: wait for the counts to
	// arrive, then for three more scrapes.
	testenv.WaitFor(t, 15*time.Second, "the plan's counts in Prometheus", func() bool {
		failed, err1 := prom.Scalar(ctx, `sum(meshbuild_agent_builds_total{outcome="failed",reason="build"})`)
		settled, err2 := prom.Scalar(ctx, `sum(meshbuild_controller_plans_settled_total{outcome="failed"})`)
		return err1 == nil && err2 == nil && failed == 1 && settled == 1
	})
	prom.WaitScrapes(ctx, 3, 10*time.Second)
	if built, err := prom.Scalar(ctx, `sum(meshbuild_agent_builds_total{outcome="built"})`); err != nil || built != 3 {
		t.Errorf("builds_total{outcome=built} summed over machines: %v (%v), want 3", built, err)
	}

	// Every agent series carries its own machine: one machine per target.
	res, err := prom.Query(ctx, `count by (instance, machine) (meshbuild_agent_builds_total)`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, r := range res {
		seen[r.Metric["instance"]] = r.Metric["machine"]
	}
	if len(seen) != 2 || seen[targets["m1"]] != "m1" || seen[targets["m2"]] != "m2" {
		t.Errorf("machines by target %v, want %s=m1 %s=m2", seen, targets["m1"], targets["m2"])
	}

	checkPanels(t, prom)
	t.Logf("%s in all", time.Since(began).Round(time.Millisecond))
}

// checkPanels asks prom every query of every dashboard panel, Grafana's
// variables replaced: each must answer a series with a number.
func checkPanels(t *testing.T, prom *testenv.Prom) {
	t.Helper()
	panels, err := metrics.DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "30s", "$__range", "1m")
	for _, p := range panels {
		prom.WantNumber(t, context.Background(), fmt.Sprintf("%s %q", p.Dashboard, p.Title), vars.Replace(p.Expr))
	}
	t.Logf("%d panel queries checked", len(panels))
}

// sleepy is the agents' worker: it sleeps for its module's time and fails
// the modules told to, with a build error.
type sleepy struct {
	mu    sync.Mutex
	sleep map[string]time.Duration
	fail  map[string]bool
}

func (w *sleepy) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	w.mu.Lock()
	d, fail := w.sleep[a.Module], w.fail[a.Module]
	w.mu.Unlock()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return agent.Result{}, context.Cause(ctx)
	}
	if fail {
		log("RUN make: exit code 2")
		return agent.Result{}, fmt.Errorf("%w: RUN make: exit code 2", agent.ErrBuild)
	}
	dg := "sha256:" + strings.Repeat(fmt.Sprintf("%02x", len(a.ID)%256), 32)
	return agent.Result{Digest: dg, Ref: a.Image + "@" + dg, Bytes: 1 << 20, CacheHits: 2, Steps: 3}, nil
}

func dial(t *testing.T, s *server.Server) jetstream.JetStream {
	t.Helper()
	_, js := natstest.Dial(t, s.ClientURL())
	return js
}

func startController(t *testing.T, s *server.Server, cat *mesh.Catalogue, obs cascade.Observer) {
	t.Helper()
	js := dial(t, s)
	cfg := cascade.DefaultConfig()
	cfg.Registry = "127.0.0.1:1"
	cfg.Images = testenv.AnyImage{} // its workers push nothing
	c, err := cascade.New(cfg, js, cat, nil, obs)
	if err != nil {
		t.Fatal(err)
	}
	stop := cascadetest.Background(t, "controller", c.Run)
	t.Cleanup(func() { stop(); js.Conn().Close() })
	cascadetest.WaitReady(t, js.Conn(), c.Module(), 10*time.Second)
}

// startFleet runs the fleet's side of the controller beside cascade's, as
// build-controller does (cascade raised the wire).
func startFleet(t *testing.T, s *server.Server, cat *mesh.Catalogue, obs deploy.Observer) {
	t.Helper()
	js := dial(t, s)
	cfg := deploy.DefaultControllerConfig()
	cfg.Raise = false
	c, err := deploy.NewController(cfg, js, cat, nil, obs)
	if err != nil {
		t.Fatal(err)
	}
	stop := cascadetest.Background(t, "fleet", c.Run)
	t.Cleanup(func() { stop(); js.Conn().Close() })
	testenv.WaitFor(t, 10*time.Second, "the fleet's controller", func() bool {
		_, err := deploy.Call(context.Background(), js.Conn(), mesh.NodesTool, deploy.Request{})
		return err == nil
	})
}

// startNode runs a node runtime and waits until it has enrolled.
func startNode(t *testing.T, s *server.Server, name string, obs deploy.Observer) {
	t.Helper()
	js := dial(t, s)
	cfg := deploy.DefaultNodeConfig()
	cfg.Name, cfg.StateDir, cfg.Heartbeat = name, t.TempDir(), time.Second
	n, err := deploy.NewNode(cfg, js, nil, obs)
	if err != nil {
		t.Fatal(err)
	}
	stop := cascadetest.Background(t, "node "+name, n.Run)
	t.Cleanup(func() { stop(); js.Conn().Close() })
	testenv.WaitFor(t, 10*time.Second, "node "+name+" to enrol", func() bool {
		r, err := deploy.Call(context.Background(), js.Conn(), mesh.NodesTool, deploy.Request{})
		return err == nil && len(r.Nodes) == 1
	})
}

func startAgent(t *testing.T, s *server.Server, machine string, w agent.Worker, obs agent.Observer) {
	t.Helper()
	js := dial(t, s)
	cfg := agent.DefaultConfig()
	cfg.Machine = machine
	cfg.FetchWait = 500 * time.Millisecond
	a, err := agent.New(cfg, js, w, nil, obs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; js.Conn().Close() })
}

func push(t *testing.T, js jetstream.JetStream, commit string) string {
	t.Helper()
	ev := mesh.Pushed{Version: 1, Repo: repo, Ref: "refs/heads/main", Commit: commit, At: time.Now().UTC()}
	data, _ := json.Marshal(ev)
	if _, err := js.Publish(testCtx(t), mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID("push-"+commit)); err != nil {
		t.Fatal(err)
	}
	return planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: commit})
}
