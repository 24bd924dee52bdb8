package cascade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
)

// BenchmarkScheduling measures the scheduler across plans through the real
// parts (benchFarm: an embedded server, the real controller, agents whose
// builds sleep):
//
//   - urgent: a 3-module chain of priority 10 pushed while a 200-module
//     plan keeps 4 machines busy, against the same chain alone on idle
//     machines: its makespan busy, less one build (the longest it may wait
//     for a machine to free up), ÷ its makespan alone (target ≤ 1.2).
//   - fair-share: two repositories of 40 modules pushed together on 4
//     machines: each one's share of the machine-time while both have work,
//     and its distance from a half (target ≤ 0.1).
//   - cost-1000: the scheduler's own work (Allot, then each plan's Fill)
//     handing 1,000 idle machines across 20 running plans of 1,000 ready
//     modules each, in process: per dispatch and per round (p99).
//
// MESHBUILD_BENCH=tiny: 1 unit is 50ms, the big plan 40 modules, 100
// machines across 4 plans of 100 for the cost.
func BenchmarkScheduling(b *testing.B) {
	unit, big := 150*time.Millisecond, 200
	if benchTiny() {
		unit, big = 50*time.Millisecond, 40
	}
	b.Run("urgent", func(b *testing.B) { benchUrgent(b, unit, big) })
	b.Run("fair-share", func(b *testing.B) { benchFairShare(b, unit) })
	b.Run("cost-1000", func(b *testing.B) {
		machines, plans, modules := 1000, 20, 1000
		if benchTiny() {
			machines, plans, modules = 100, 4, 100
		}
		benchScheduleCost(b, machines, plans, modules)
	})
}

// schedFarm is a benchFarm for a catalogue of flat modules and chains.
func schedFarm(b *testing.B, mods []*mesh.Manifest, machines int, unit time.Duration) *benchFarm {
	ms := append(meshtest.MeshManifests(b), mods...)
	f := newBenchFarm(b, mesh.NewCatalogue(ms), cascade.DefaultConfig(), machines, 1)
	d := map[string]time.Duration{}
	for _, m := range mods {
		d[m.Module] = unit
	}
	f.work.dur.Store(&d)
	return f
}

// pushPlan announces a push and returns its plan and when it was published.
func (f *benchFarm) pushPlan(repo, commit string, sched *mesh.Schedule) (string, time.Time) {
	f.tb.Helper()
	data, _ := json.Marshal(mesh.Pushed{Version: 1, Repo: repo, Ref: "refs/heads/main", Commit: commit, At: time.Now().UTC(), Schedule: sched})
	t0 := time.Now()
	if _, err := f.js.Publish(context.Background(), mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID(repo+"@"+commit)); err != nil {
		f.tb.Fatal(err)
	}
	return planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: commit}), t0
}

// awaitRecord watches a plan's record until cond holds.
func (f *benchFarm) awaitRecord(plan string, d time.Duration, cond func(cascade.PlanRecord) bool) cascade.PlanRecord {
	f.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	w, err := f.kv.Watch(ctx, cascade.PlanKey(plan))
	if err != nil {
		f.tb.Fatal(err)
	}
	defer w.Stop()
	return f.untilRecord(ctx, w, plan, d, cond)
}

// untilRecord reads plan's records from w until cond holds; ctx (of d)
// ending first fails the benchmark.
func (f *benchFarm) untilRecord(ctx context.Context, w jetstream.KeyWatcher, plan string, d time.Duration, cond func(cascade.PlanRecord) bool) cascade.PlanRecord {
	f.tb.Helper()
	var rec cascade.PlanRecord
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				f.tb.Fatal(err)
			}
			if cond(rec) {
				return rec
			}
		case <-ctx.Done():
			f.tb.Fatalf("plan %s: not there in %s: %+v", plan, d, rec.Counts)
		}
	}
}

func settled(r cascade.PlanRecord) bool {
	return r.Outcome != "" && r.Outcome != cascade.OutcomeRunning
}

func chain(repo, prefix string, n int) []*mesh.Manifest {
	out := flat(repo, prefix, n)
	for i := 1; i < n; i++ {
		out[i].Build.On = []string{out[i-1].Module}
	}
	return out
}

// The urgent chain's repository and the big plan's (benchUrgent).
const fixRepo, bigRepo = "https://git.example/fix.git", "https://git.example/big.git"

// benchUrgent reports the medians of 3 runs (urgentRun), each on a new farm.
func benchUrgent(b *testing.B, unit time.Duration, big int) {
	mods := append(flat(bigRepo, "b", big), chain(fixRepo, "fix", 3)...)
	var alone, busy []float64
	runs := 3 // one is as much the host's moment as the scheduler
	if benchTiny() {
		runs = 1
	}
	for b.Loop() {
		for range runs {
			urgentRun(b, mods, unit, &alone, &busy)
		}
	}
	a, s := median(alone), median(busy)
	b.ReportMetric((s-unit.Seconds())/a, "urgent-busy-less-one-build/alone")
	b.ReportMetric(s/a, "urgent-busy/alone")
	b.ReportMetric(1000*a, "alone-ms")
	b.ReportMetric(1000*s, "busy-ms")
	b.ReportMetric(unit.Seconds()*1000, "unit-ms")
	b.ReportMetric(float64(len(busy)), "runs")
}

// urgentRun measures the urgent chain alone and beside the big plan once,
// on a new farm.
func urgentRun(b *testing.B, mods []*mesh.Manifest, unit time.Duration, alone, busy *[]float64) {
	f := schedFarm(b, mods, 4, unit)
	p, t0 := f.pushPlan(fixRepo, "alone", &mesh.Schedule{Priority: priority(10)})
	rec := f.awaitRecord(p, time.Minute, settled)
	*alone = append(*alone, rec.Updated.Sub(t0).Seconds())
	f.waitIdle()
	bp, _ := f.pushPlan(bigRepo, "c1", &mesh.Schedule{Owner: "team"})
	// Every machine busy with it: some built, and at least 4 taken or
	// queued (a build shorter than the agents' StartedDelay is counted
	// queued until it is built).
	f.awaitRecord(bp, time.Minute, func(r cascade.PlanRecord) bool {
		return r.Counts.Queued+r.Counts.Building >= 4 && r.Counts.Built >= 4
	})
	p, t0 = f.pushPlan(fixRepo, "busy", &mesh.Schedule{Owner: "team", Priority: priority(10)})
	rec = f.awaitRecord(p, time.Minute, settled)
	*busy = append(*busy, rec.Updated.Sub(t0).Seconds())
	if r := f.awaitRecord(bp, time.Minute, func(cascade.PlanRecord) bool { return true }); settled(r) {
		b.Fatalf("the big plan settled before the urgent one: the run measures nothing")
	}
	f.Close()
}

func benchFairShare(b *testing.B, unit time.Duration) {
	const ra, rb = "https://git.example/a.git", "https://git.example/b.git"
	mods := append(flat(ra, "a", 40), flat(rb, "b", 40)...)
	var shares []float64
	for b.Loop() {
		f := schedFarm(b, mods, 4, unit)
		pa, t0 := f.pushPlan(ra, "c1", nil)
		pb, _ := f.pushPlan(rb, "c1", nil)
		f.awaitRecord(pa, time.Minute, settled)
		f.awaitRecord(pb, time.Minute, settled)
		ma, mb := f.modules(b, pa), f.modules(b, pb)
		until := lastStart(ma)
		if lb := lastStart(mb); lb.Before(until) {
			until = lb
		}
		x, y := busy(intervals(ma), t0, until), busy(intervals(mb), t0, until)
		shares = append(shares, x.Seconds()/(x+y).Seconds())
		f.Close()
	}
	s := median(shares)
	b.ReportMetric(s, "share-a")
	b.ReportMetric(math.Abs(s-0.5), "share-gap")
}

// benchScheduleCost times the scheduler's own work for rounds that each
// hand every machine to the plans: Allot, then each plan's Fill of what it
// was given, on plans whose held asks are then put back (a fresh state per
// round would time the copying).
func benchScheduleCost(b *testing.B, machines, plans, modules int) {
	states := make([]*cascade.State, plans)
	for i := range states {
		ms := flat(fmt.Sprintf("https://git.example/r%d.git", i), fmt.Sprintf("r%d-", i), modules)
		p, err := planner.New(mesh.NewCatalogue(ms), planner.Trigger{Kind: planner.KindPush, Repo: ms[0].Build.Repo, Commit: "c"})
		if err != nil {
			b.Fatal(err)
		}
		st := cascade.NewState(p, time.Unix(0, 0))
		st.Seq, st.Owner, st.Priority = uint64(i+1), fmt.Sprintf("owner-%d", i%5), i%3
		st.Window = -1
		st.Start(time.Unix(0, 0))
		states[i] = st
	}
	var rounds []time.Duration
	given := 0
	for b.Loop() {
		for range costRounds {
			given += scheduleRound(b, states, machines, &rounds)
		}
	}
	slices.Sort(rounds)
	p99 := rounds[min(len(rounds)-1, len(rounds)*99/100)]
	b.ReportMetric(float64(p99)/float64(time.Millisecond), "round-p99-ms")
	b.ReportMetric(float64(p99)/float64(time.Microsecond)/float64(machines), "p99-us/dispatch")
	b.ReportMetric(float64(machines), "machines")
	b.ReportMetric(float64(len(rounds)), "rounds")
}

// costRounds is how many rounds one iteration of the cost benchmark times.
const costRounds = 30

// scheduleRound times one round on copies of the plans, appending its
// time to rounds; it returns the asks handed out.
func scheduleRound(b *testing.B, states []*cascade.State, machines int, rounds *[]time.Duration) int {
	plans := len(states)
	{
		// Fresh plans each round: copies made outside the timing.
		work := make([]*cascade.State, plans)
		for i, st := range states {
			data, _ := json.Marshal(st)
			work[i] = &cascade.State{}
			if err := json.Unmarshal(data, work[i]); err != nil {
				b.Fatal(err)
			}
		}
		t := time.Now()
		claims := make([]cascade.Claim, len(work))
		for i, st := range work {
			c := st.Counts()
			claims[i] = cascade.Claim{Plan: st.Plan, Priority: st.Priority, Owner: st.Owner, Seq: st.Seq, Ready: c.Ready,
				Busy: c.Queued + c.Building, Estimate: st.MeanEstimate()}
		}
		a := cascade.Allot(machines, claims, map[string]float64{"owner-0": 100}, cascade.SharePolicy{})
		n := 0
		for _, st := range work {
			if g := a.Give[st.Plan]; g > 0 {
				st.Window = g
				n += len(st.Fill(time.Unix(1, 0)))
			}
		}
		*rounds = append(*rounds, time.Since(t))
		if n != machines {
			b.Fatalf("a round handed out %d asks to %d machines", n, machines)
		}
		return n
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	return s[len(s)/2]
}
