package agent_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

// BenchmarkFailover measures what failures cost, with the holders'
// defaults (mesh.HolderAckWait, the ask claim's lease, the heartbeat):
//
//   - kill: the seconds from the loss of a machine in the middle of a build
//     (its connection dropped with no word, as kill -9 leaves it) to its
//     ask started on another machine that was idle all along; each run a
//     fresh server and two agents, the median (and the slowest) of the runs
//     (MESHBUILD_BENCH=tiny: one);
//   - registry gone: a registry gone for good, on two machines (real
//     buildkitds, the real registry stopped): the time from the ask's first
//     failing attempt to its failed{infra}, over its --retry-for budget,
//     both machines sick (target: the budget, ± 10 %).
func BenchmarkFailover(b *testing.B) {
	runs := 3
	if benchTiny() {
		runs = 1
	}
	for range b.N {
		var took []time.Duration
		for i := range runs {
			d, _ := killToStarted(b, fmt.Sprintf("k%d", i))
			took = append(took, d)
		}
		slices.Sort(took)
		b.ReportMetric(took[len(took)/2].Seconds(), "kill-to-started-s")
		b.ReportMetric(took[len(took)-1].Seconds(), "kill-to-started-max-s")
		b.ReportMetric(mesh.HolderAckWait.Seconds(), "ack-wait-s")
		b.ReportMetric(float64(runs), "runs")
		if os.Getenv(testenv.BuildkitEnv) == "1" {
			budget := 10 * time.Second
			gone := registryGoneToFailed(b, budget)
			b.ReportMetric(gone.Seconds(), "registry-gone-to-failed-s")
			b.ReportMetric(gone.Seconds()/budget.Seconds(), "registry-gone/budget")
			b.ReportMetric(budget.Seconds(), "budget-s")
		}
	}
}

// killToStarted kills the machine building ask id and returns how long
// until another machine (m2, idle all along) started it, the ask released
// there to be built, and the bus.
func killToStarted(b testing.TB, id string) (time.Duration, jetstream.JetStream) {
	s, js := busAckWait(b, mesh.HolderAckWait)
	g := newGate()
	a1 := startAgent(b, s, "m1", g.on("m1"), func(c *agent.Config) { c.Grace, c.Heartbeat = 0, 0 })
	submit(b, js, ask(id))
	recv(b, g.began, 10*time.Second)
	startAgent(b, s, "m2", g.on("m2"), func(c *agent.Config) { c.Heartbeat = 0 })
	// Let m2 settle into its idle pull, as a machine idle all along.
	time.Sleep(time.Second)
	a1.nc.Close()
	killed := time.Now()
	a1.cancel()
	if got := recv(b, g.began, mesh.HolderAckWait+30*time.Second); got != id {
		b.Fatalf("m2 began %s, want %s", got, id)
	}
	took := time.Since(killed)
	g.ch(id) <- nil
	return took, js
}

// registryGoneToFailed stops a registry for good under two machines and
// returns how long after the ask's first (failing) attempt it was failed
// {infra}, "no healthy machine".
func registryGoneToFailed(b *testing.B, budget time.Duration) time.Duration {
	addr := testenv.FreeAddr(b)
	srv, err := registry.Serve(context.Background(), addr, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	bk := testenv.Buildkitd(b, addr)
	git, commit := testenv.GitRepo(b, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY Dockerfile /\n"})
	s, js := bus(b)
	// Each attempt announces started, however soon it fails: the budget
	// is measured from the first.
	cfg := func(c *agent.Config) { c.RetryFor, c.ProbeEvery, c.StartedDelay = budget, 0, 0 }
	startAgent(b, s, "m1", realWorker(b, bk, git), cfg)
	startAgent(b, s, "m2", realWorker(b, bk, git), cfg)
	srv.Close() // gone for good
	submit(b, js, realAsk("gone", commit, "app", addr+"/gone"))
	deadline := time.Now().Add(budget + 2*time.Minute)
	for countEvents(b, js, mesh.EventFailed) == 0 {
		if time.Now().After(deadline) {
			b.Fatalf("the ask did not settle within its budget %s and two minutes", budget)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r := events(b, js)
	if len(r.Failed) != 1 || len(r.Started) == 0 || r.Failed[0].Reason != mesh.ReasonInfra || !strings.Contains(r.Failed[0].Message, "no healthy machine") {
		b.Fatalf("failed %+v after %d starts: want one failed{infra}, no healthy machine", r.Failed, len(r.Started))
	}
	return r.Failed[0].At.Sub(r.Started[0].At)
}
