package agent_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
// the registry), hands the ask back (its budget, a minute here, recorded
// in its claim) and stops building — the asks stay queued, none failed,
// none built — while it probes. The
// registry is started again on the same address: the agent resumes, and
// every ask is built once.
func TestAMachineWhoseRegistryDoesNotAnswerStopsTakingAsks(t *testing.T) {
	testenv.RequireBuildkit(t)
	addr, dir := testenv.FreeAddr(t), t.TempDir()
	srv, err := registry.Serve(context.Background(), addr, dir)
	if err != nil {
		t.Fatal(err)
	}
	bk := testenv.Buildkitd(t, addr)
	git, commit := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY Dockerfile /\n"})
	s, js := bus(t)
	w := &counted{w: realWorker(t, bk, git)}
	health := make(healthSeen, 10)
	// No idle probe: the registry is found sick by the failure of a push.
	startObserved(t, s, "m1", w, func(c *agent.Config) { c.RetryFor, c.ProbeEvery = time.Minute, 0 }, health)
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
		t.Fatalf("failed %+v: want none (within the asks' budget)", r.Failed)
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

// The registry goes for good (issue 20, 4): two machines, each finds it
// gone on its push and turns sick, and then neither builds. The ask's
// budget (--retry-for, 6s here) is spent by every attempt and every
// hand-back on either machine, so it settles failed{infra} when the budget
// is gone — within 10% of it, plus a second to notice — with a message
// naming the registry; before, every hand-back was announced (handed-back,
// sick, naming the registry, the budget's start the same on both).
func TestAnAskSettlesWhenItsBudgetIsGoneThoughEveryMachineIsSick(t *testing.T) {
	testenv.RequireBuildkit(t)
	addr := testenv.FreeAddr(t)
	srv, err := registry.Serve(context.Background(), addr, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bk := testenv.Buildkitd(t, addr)
	git, commit := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY Dockerfile /\n"})
	s, js := bus(t)
	const budget = 6 * time.Second
	cfg := func(c *agent.Config) { c.RetryFor, c.ProbeEvery = budget, 0 }
	startAgent(t, s, "m1", realWorker(t, bk, git), cfg)
	startAgent(t, s, "m2", realWorker(t, bk, git), cfg)
	srv.Close() // gone for good

	submit(t, js, realAsk("gone", commit, "app", addr+"/gone"))
	testenv.WaitFor(t, 120*time.Second, "the ask settled", func() bool { return countEvents(t, js, mesh.EventFailed) == 1 })
	r := events(t, js)
	f := r.Failed[0]
	if f.Reason != mesh.ReasonInfra || !strings.Contains(f.Message, "no healthy machine: registry "+addr+" does not answer") ||
		!strings.Contains(f.Message, "more than --retry-for 6s") {
		t.Fatalf("failed %+v: want infra, no healthy machine, naming registry %s and the budget", f, addr)
	}
	if len(r.Started) == 0 {
		t.Fatal("the ask never started: nothing found the registry gone")
	}
	first := r.Started[0].At // its first (failing) attempt: the budget's start
	took := f.At.Sub(first)
	t.Logf("from the first failing attempt to failed{infra}: %s (budget %s); %d hand-backs, %d attempts started", took.Round(time.Millisecond), budget, len(r.Back), len(r.Started))
	if took < budget || took > budget+budget/10+time.Second {
		t.Errorf("settled %s after its first attempt: want within its budget %s, +10%% and a second to notice", took, budget)
	}
	sick := map[string]bool{}
	for _, b := range r.Back {
		if !b.Sick || !strings.Contains(b.Why, "registry "+addr+" does not answer") || b.InfraSince.IsZero() {
			t.Errorf("handed-back %+v: want sick, naming the registry, with the budget's start", b)
			continue
		}
		if d := b.InfraSince.Sub(first); d < -time.Second || d > time.Second {
			t.Errorf("handed-back %+v: its budget starts at %s, want the first attempt's, %s", b, b.InfraSince, first)
		}
		sick[b.On] = true
	}
	if !sick["m1"] || !sick["m2"] {
		t.Errorf("sick hand-backs from %v: want both machines", sick)
	}
	if len(r.Built) != 0 {
		t.Fatalf("built %+v: want nothing", r.Built)
	}
	testenv.WaitFor(t, 10*time.Second, "the queue settled", func() bool {
		info := consumerInfo(t, js)
		return info.NumPending == 0 && info.NumAckPending == 0
	})
}

// countEvents is how many events of the build seat named event EVENTS
// holds, from any machine (cheap enough to poll: no consumer).
func countEvents(t testing.TB, js jetstream.JetStream, event string) uint64 {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, mesh.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, event)))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// The registry stands still mid-push (by hand: kill -STOP; here a proxy
// that holds every byte, its connections open): BuildKit's push would wait
// for as long as it stands still, the ask held all along. The machine's
// pings during the build find the registry not answering: the build is
// stopped, its ask goes back, the machine turns sick naming the registry.
// Once the registry answers again the ask is built, once.
func TestABuildWhoseRegistryStandsStillIsStopped(t *testing.T) {
	testenv.RequireBuildkit(t)
	addr := testenv.FreeAddr(t)
	srv, err := registry.Serve(context.Background(), addr, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	fz := testenv.Freeze(t, addr)
	bk := testenv.Buildkitd(t, fz.Addr())
	git, commit := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY Dockerfile /\n"})
	s, js := bus(t)
	ended := make(ends, 10)
	startObserved(t, s, "m1", realWorker(t, bk, git), func(c *agent.Config) {
		c.RetryFor, c.ProbeEvery, c.ProbeTimeout = time.Minute, 3*time.Second, time.Second
	}, ended)
	fz.Freeze()
	frozen := time.Now()
	submit(t, js, realAsk("still", commit, "app", fz.Addr()+"/app"))
	e := ended.next(t, agent.OutcomeHandedBack, 60*time.Second)
	t.Logf("handed back %s after the registry stood still", time.Since(frozen).Round(time.Millisecond))
	if st := status(t, js, "m1"); st.Health != agent.HealthUnhealthy || !strings.Contains(st.Why, fz.Addr()) {
		t.Errorf("m1 %+v: want unhealthy, naming the registry %s", st, fz.Addr())
	}
	if e.Took == 0 {
		t.Errorf("handed back %+v: want it after the work that was stopped", e)
	}
	fz.Thaw()
	r := builtOnce(t, js, 90*time.Second, "built once the registry answers")
	if len(r.Failed) != 0 || r.Built[0].Ask != "still" {
		t.Fatalf("built %+v failed %+v: want the ask built, nothing failed", r.Built, r.Failed)
	}
}
