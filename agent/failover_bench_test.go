package agent_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/mesh"
)

// BenchmarkFailover measures what a lost machine costs: the seconds from the
// loss of a machine in the middle of a build (its connection dropped with
// no word, as kill -9 leaves it) to its ask started on another machine that
// was idle all along, with the holders' defaults (mesh.HolderAckWait, the
// ask claim's lease, the heartbeat). Each run is a fresh server and two
// agents; the figure is the median (and the slowest) of the runs
// (MESHBUILD_BENCH=tiny: one).
func BenchmarkFailover(b *testing.B) {
	runs := 3
	if benchTiny() {
		runs = 1
	}
	for range b.N {
		var took []time.Duration
		for i := range runs {
			took = append(took, killToStarted(b, fmt.Sprintf("k%d", i)))
		}
		slices.Sort(took)
		b.ReportMetric(took[len(took)/2].Seconds(), "kill-to-started-s")
		b.ReportMetric(took[len(took)-1].Seconds(), "kill-to-started-max-s")
		b.ReportMetric(mesh.HolderAckWait.Seconds(), "ack-wait-s")
		b.ReportMetric(float64(runs), "runs")
	}
}

// killToStarted kills the machine building ask id and returns how long
// until another machine started it.
func killToStarted(b *testing.B, id string) time.Duration {
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
	return took
}
