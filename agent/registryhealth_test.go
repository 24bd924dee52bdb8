package agent_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

// counted passes a real worker through, counting its work and probes.
type counted struct {
	w              agent.Worker
	worked, probes atomic.Int32
}

func (c *counted) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	c.worked.Add(1)
	return c.w.Work(ctx, a, log)
}

func (c *counted) Probe(ctx context.Context) error {
	c.probes.Add(1)
	return c.w.(agent.Prober).Probe(ctx)
}

// The registry is stopped mid-run: the push of the next ask fails on it,
// the agent finds its registry does not answer, says so (unhealthy, naming
// the registry), hands the ask back without spending its budget (it has
// none: one infrastructure failure of its own would fail it) and stops
// fetching — the asks stay queued, none failed — while it probes. The
// registry is started again on the same address: the agent resumes, and
// every ask is built once.
func TestAMachineWhoseRegistryDoesNotAnswerStopsTakingAsks(t *testing.T) {
	testenv.RequireBuildkit(t)
	addr, dir := freeAddr(t), t.TempDir()
	srv, err := registry.Serve(context.Background(), addr, dir)
	if err != nil {
		t.Fatal(err)
	}
	bk := testenv.Buildkitd(t, addr)
	git, commit := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY Dockerfile /\n"})
	s, js := bus(t)
	w := &counted{w: realWorker(t, bk, git)}
	health := make(healthSeen, 10)
	// No retry budget, and no idle probe: the registry is found sick by
	// the failure of a push.
	startObserved(t, s, "m1", w, func(c *agent.Config) { c.RetryFor, c.ProbeEvery = 0, 0 }, health)
	submit(t, js, realAsk("before", commit, "app", addr+"/app"))
	testenv.WaitFor(t, 60*time.Second, "built before the outage", func() bool { return len(events(t, js).Built) == 1 })

	srv.Close()
	submit(t, js, realAsk("during", commit, "app", addr+"/during"))
	select {
	case ok := <-health:
		if ok {
			t.Fatal("told healthy, want unhealthy")
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the agent was not told unhealthy within 90s of the registry stopping")
	}
	st := status(t, js, "m1")
	if st.Health != agent.HealthUnhealthy || !strings.Contains(st.Why, "registry "+addr) {
		t.Fatalf("status %+v: want unhealthy, naming registry %s", st, addr)
	}
	submit(t, js, realAsk("queued", commit, "app", addr+"/queued"))
	// The ask it could not build goes back; it probes with backoff and
	// takes nothing meanwhile: both asks stay in the queue, neither failed.
	testenv.WaitFor(t, 10*time.Second, "the ask handed back", func() bool { return status(t, js, "m1").InFlight == 0 })
	worked, probes := w.worked.Load(), w.probes.Load()
	testenv.WaitFor(t, 30*time.Second, "three more probes", func() bool { return w.probes.Load() >= probes+3 })
	if n := w.worked.Load(); n != worked {
		t.Fatalf("the sick agent worked %d asks while it probed, want none", n-worked)
	}
	// (An ask handed back counts as pending an ack until it is delivered
	// again.)
	if info := consumerInfo(t, js); info.NumPending+uint64(info.NumAckPending) != 2 {
		t.Fatalf("queue: %d pending, %d pending an ack: want both asks in it", info.NumPending, info.NumAckPending)
	}
	if st := status(t, js, "m1"); st.InFlight != 0 || st.Health != agent.HealthUnhealthy {
		t.Fatalf("status %+v: want unhealthy and working on nothing", st)
	}
	if r := events(t, js); len(r.Failed) != 0 {
		t.Fatalf("failed %+v: want none (the machine's failure spends no ask's budget)", r.Failed)
	}

	// The registry is back on the same address, with its content.
	srv, err = registry.Serve(context.Background(), addr, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	select {
	case ok := <-health:
		if !ok {
			t.Fatal("told unhealthy again, want healthy")
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the agent was not told healthy within 90s of the registry's return")
	}
	testenv.WaitFor(t, 120*time.Second, "every ask built", func() bool { return len(events(t, js).Built) == 3 })
	testenv.WaitFor(t, 10*time.Second, "the queue settled", func() bool {
		info := consumerInfo(t, js)
		return info.NumPending == 0 && info.NumAckPending == 0
	})
	r := events(t, js)
	seen := map[string]int{}
	for _, b := range r.Built {
		seen[b.Ask]++
	}
	if len(r.Failed) != 0 || seen["before"] != 1 || seen["during"] != 1 || seen["queued"] != 1 {
		t.Fatalf("built %v failed %+v: want each ask built once, none failed", seen, r.Failed)
	}
	if st := status(t, js, "m1"); st.Health != agent.HealthHealthy {
		t.Fatalf("status %+v: want healthy", st)
	}
}
