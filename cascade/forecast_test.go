package cascade

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade/sim"
)

// A plan's forecast by hand: base built; runtime (2m) building for 30s;
// tool (3m) on runtime waiting; web (1m) on base queued; cli (no
// estimate) on tool waiting; a failed module and one blocked by it hold
// nothing up.
func TestCriticalPathByHand(t *testing.T) {
	now := t0.Add(90 * time.Second)
	mods := []ModuleStatus{
		{Module: "base", State: Built, Estimate: time.Minute},
		{Module: "broken", State: Failed, Estimate: time.Hour},
		{Module: "runtime", Bases: []string{"base"}, State: Building, On: "host-a1", Started: t0.Add(time.Minute)},
		{Module: "web", Bases: []string{"base"}, State: Queued, Estimate: time.Minute},
		{Module: "after-broken", Bases: []string{"broken"}, State: Blocked, Estimate: time.Hour},
		{Module: "tool", Bases: []string{"runtime"}, State: Waiting},
		{Module: "cli", Bases: []string{"tool", "web"}, State: Waiting},
	}
	est := map[string]time.Duration{"runtime": 2 * time.Minute, "tool": 3 * time.Minute}

	f := CriticalPath(mods, est, now, 0)
	// Known estimates: base 1m, broken 1h, runtime 2m, web 1m, after-broken
	// 1h, tool 3m: cli guesses their mean, 2h8m/6.
	guess := (2*time.Hour + 7*time.Minute) / 6
	if f.Unknown || f.Bound != BoundPath || f.Left != 4 || f.Guessed != 1 {
		t.Fatalf("forecast %+v", f)
	}
	var path []string
	for _, s := range f.Path {
		path = append(path, fmt.Sprintf("%s %s %s", s.Module, s.State, s.Left))
	}
	// runtime has taken 30s of 2m: it has a little more than 1m30s left
	// (builds are noisy; see leftOf).
	rtLeft := leftOf(2*time.Minute, 30*time.Second, defaultSpread)
	if rtLeft < 90*time.Second || rtLeft > 100*time.Second {
		t.Errorf("runtime has %s left, want a little over 1m30s", rtLeft)
	}
	want := []string{"runtime building " + rtLeft.String(), "tool waiting 3m0s", "cli waiting " + guess.String()}
	if strings.Join(path, "; ") != strings.Join(want, "; ") {
		t.Errorf("path %q, want %q", path, want)
	}
	if left := rtLeft + 3*time.Minute + guess; f.PathLeft != left || f.Remaining != left || !f.Finish.Equal(now.Add(left)) {
		t.Errorf("path left %s, remaining %s, finish %s; want %s", f.PathLeft, f.Remaining, f.Finish, left)
	}
	if work := rtLeft + time.Minute + 3*time.Minute + guess; f.Work != work {
		t.Errorf("work %s, want %s", f.Work, work)
	}
	h, ok := f.Holding()
	if !ok || h.Module != "runtime" || h.On != "host-a1" || h.Overdue {
		t.Errorf("holding %+v", h)
	}
	if line := f.String(); !strings.HasPrefix(line, "waiting on runtime (building on host-a1): 1m36s of 25m46s left on the critical path; finish ≈ ") {
		t.Errorf("line %q", line)
	}

	// One machine: the work, not the path, decides.
	if f1 := CriticalPath(mods, est, now, 1); f1.Bound != BoundMachines || f1.Remaining != f.Work || f1.PathLeft != f.PathLeft {
		t.Errorf("on one machine: %+v", f1)
	}
	// Later: runtime overdue (9m of 2m): it still holds the plan up, with
	// less left than it has taken, more than nothing.
	late := CriticalPath(mods, est, t0.Add(10*time.Minute), 0)
	if h, _ := late.Holding(); h.Module != "runtime" || !h.Overdue || h.Left <= 0 || h.Left >= 9*time.Minute {
		t.Errorf("overdue: holding %+v", h)
	}
	if line := late.String(); !strings.HasPrefix(line, "waiting on runtime (building on host-a1, past its 2m0s estimate): ") ||
		!strings.Contains(line, " left on the critical path; finish ≈ ") || strings.Contains(line, "overdue of") {
		t.Errorf("overdue line %q, want it past its estimate, then the path left", line)
	}
	// Runtime built: tool holds it up.
	mods[2].State = Built
	if f := CriticalPath(mods, est, now, 0); f.Path[0].Module != "tool" || f.PathLeft != 3*time.Minute+guess {
		t.Errorf("after runtime: %+v", f)
	}
}

// A module whose ask no machine online can take (its platform has none)
// leaves the plan with no finish to promise: the line says which module
// and why instead of a finish that passes with nothing built; once a
// machine comes (the note gone) the finish is back.
func TestAPlanWaitingForAPlatformWithNoMachineHasNoFinish(t *testing.T) {
	mods := []ModuleStatus{
		{Module: "base", State: Built, Estimate: time.Minute},
		{Module: "tool", Bases: []string{"base"}, State: Building, On: "host-a1", Started: t0, Estimate: time.Minute},
		{Module: "odd-arm", Bases: []string{"base"}, State: Queued, Estimate: 2 * time.Minute, Waiting: NoMachine([]string{"linux/arm64"})},
	}
	f := CriticalPath(mods, nil, t0, 2)
	if f.Stalled != "odd-arm waits: no linux/arm64 machine online" {
		t.Fatalf("stalled %q", f.Stalled)
	}
	line := f.String()
	if !strings.HasSuffix(line, "; no finish estimate while odd-arm waits: no linux/arm64 machine online") || strings.Contains(line, "finish ≈") {
		t.Errorf("line %q", line)
	}
	mods[2].Waiting = ""
	if f := CriticalPath(mods, nil, t0, 2); f.Stalled != "" || !strings.Contains(f.String(), "; finish ≈ ") {
		t.Errorf("with a machine: %+v, %q", f, f.String())
	}
}

// At first sight (no build time known) a farm with no machine at all says
// so too, not that it only lacks build times.
func TestAFirstPlanOnAFarmWithNoMachineSaysWhyItWaits(t *testing.T) {
	mods := []ModuleStatus{
		{Module: "base", State: Queued, Waiting: NoMachine([]string{"linux/amd64"})},
		{Module: "tool", Bases: []string{"base"}, State: Waiting},
	}
	f := CriticalPath(mods, nil, t0, 0)
	if !f.Unknown {
		t.Fatalf("no estimates, yet known: %+v", f)
	}
	if line := f.String(); line != "waiting on base (queued): 2 of 2 modules left on the critical path; no finish estimate while base waits: no linux/amd64 machine online" {
		t.Errorf("line %q", line)
	}
	mods[0].Waiting = ""
	if line := CriticalPath(mods, nil, t0, 1).String(); !strings.HasSuffix(line, "; no build times known yet, no finish estimate") {
		t.Errorf("with a machine: %q", line)
	}
}

// A module handed back to be retried after a delay holds its chain up by
// the delay too, and the line says when its next attempt is.
func TestARetryDelayIsOnTheCriticalPath(t *testing.T) {
	now := t0
	mods := []ModuleStatus{
		{Module: "flaky", State: Queued, Estimate: 2 * time.Second,
			HandedBack: &HandedBack{Attempt: 3, Why: "registry unreachable", Next: now.Add(49 * time.Second), At: now.Add(-time.Second)}},
		{Module: "after", Bases: []string{"flaky"}, State: Waiting, Estimate: time.Second},
		{Module: "other", State: Queued, Estimate: 10 * time.Second},
	}
	f := CriticalPath(mods, nil, now, 0)
	h, ok := f.Holding()
	if !ok || h.Module != "flaky" || h.Delay != 49*time.Second || h.Left != 51*time.Second || f.PathLeft != 52*time.Second {
		t.Fatalf("forecast %+v: want flaky holding it up, 49s before its next attempt and 51s left, 52s on the path", f)
	}
	if line := f.String(); !strings.HasPrefix(line, "waiting on flaky (queued, next attempt in 49s): 51s of 52s left on the critical path; finish ≈ ") {
		t.Errorf("line %q", line)
	}
	// Its delay past (the next attempt due, not yet taken): its estimate alone.
	if f := CriticalPath(mods, nil, now.Add(time.Minute), 0); f.Path[0].Module != "other" || f.Path[0].Left != 10*time.Second {
		t.Errorf("after the delay: %+v", f)
	}
	// Without estimates the path is counted in modules; the delay is still said.
	for i := range mods {
		mods[i].Estimate = 0
	}
	if u := CriticalPath(mods, nil, now, 0); !u.Unknown || len(u.Path) != 2 || u.Path[0].Delay != 49*time.Second ||
		!strings.HasPrefix(u.String(), "waiting on flaky (queued, next attempt in 49s): 2 of 3 modules left") {
		t.Errorf("unknown: %+v %q", u, u.String())
	}
}

func TestCriticalPathWithoutEstimatesCountsModules(t *testing.T) {
	now := time.Now()
	mods := []ModuleStatus{
		{Module: "a", State: Queued},
		{Module: "b", Bases: []string{"a"}, State: Waiting},
		{Module: "c", Bases: []string{"b"}, State: Waiting},
		{Module: "d", Bases: []string{"a"}, State: Waiting},
	}
	f := CriticalPath(mods, nil, now, 4)
	if !f.Unknown || len(f.Path) != 3 || f.Path[2].Module != "c" || f.Remaining != 0 || !f.Finish.Equal(now) || f.Left != 4 {
		t.Errorf("forecast %+v", f)
	}
	if !strings.Contains(f.String(), "3 of 4 modules left") {
		t.Errorf("line %q", f.String())
	}
}

func TestCriticalPathOfASettledOrCancelledPlan(t *testing.T) {
	now := time.Now()
	f := CriticalPath([]ModuleStatus{{Module: "a", State: Built, Estimate: time.Second}}, nil, now, 2)
	if len(f.Path) != 0 || f.Remaining != 0 || f.Left != 0 || f.String() != "nothing left to build" {
		t.Errorf("settled: %+v", f)
	}
	st := NewState(plan(t, "a:", "b: a"), now)
	st.Start(now)
	st.Cancel(now)
	if f := st.Forecast(nil, now, 0); len(f.Path) != 0 {
		t.Errorf("cancelled: %+v", f)
	}
}

// etaErrors runs the 1,000-module DAG (10 layers, 50 machines, window 1 as
// the controller) with each module's estimate its last build time and its
// build now taking that times a lognormal noise of σ, and evaluates the
// forecast at 25, 50 and 75% of the plan's real duration. It returns, per
// point, the mean absolute and the mean signed error of the estimated
// remaining time, relative to the real remaining time, over the seeds.
//
// naive is the mean absolute error of the count-based extrapolation a
// progress bar gives (elapsed × total modules / modules done), for
// comparison.
func etaErrors(tb testing.TB, sigma float64, seeds uint64, machines, forecastMachines int) (abs, bias, naive [3]float64) {
	points := []float64{0.25, 0.5, 0.75}
	for seed := range seeds {
		d := sim.RandomLayeredDAG(1000, 10, seed)
		p, err := d.Plan()
		if err != nil {
			tb.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 0xe7a))
		est := map[string]time.Duration{}
		dur := map[string]float64{}
		for i, name := range d.Names {
			est[name] = time.Duration(d.Dur[i] * float64(time.Second))
			dur[name] = d.Dur[i] * math.Exp(sigma*rng.NormFloat64())
		}
		setup := func(s *State) { s.SetEstimates(est); s.Window = 1 }
		total, err := simulateState(p, dur, machines, setup)
		if err != nil {
			tb.Fatal(err)
		}
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		end := start.Add(time.Duration(total * float64(time.Second)))
		probes := []float64{points[0] * total, points[1] * total, points[2] * total}
		k := 0
		_, err = simulateStateProbed(p, dur, machines, setup, probes, func(s *State, at time.Time) {
			f := s.Forecast(est, at, forecastMachines)
			real := end.Sub(at).Seconds()
			e := (f.Finish.Sub(end).Seconds()) / real
			abs[k] += math.Abs(e) / float64(seeds)
			bias[k] += e / float64(seeds)
			c := s.Counts()
			elapsed := at.Sub(start).Seconds()
			guess := elapsed*float64(c.Total)/float64(max(c.Built, 1)) - elapsed
			naive[k] += math.Abs(guess-real) / real / float64(seeds)
			k++
		})
		if err != nil {
			tb.Fatal(err)
		}
		if k != 3 {
			tb.Fatalf("seed %d: %d probes of 3", seed, k)
		}
	}
	return abs, bias, naive
}

// The ETA on the 1,000-module DAG with noisy build times (σ 0.3 around
// each estimate), at a quarter, half and three quarters of the plan: its
// bias is small, and it is nearer the real remaining time than the
// count-based extrapolation of a progress bar (BenchmarkETA1000On50
// reports the figures over more seeds). The error left is the noise of
// the few long builds that make the critical path.
func TestETAOnTheThousandModuleDAG(t *testing.T) {
	abs, bias, naive := etaErrors(t, 0.3, 6, 50, 50)
	for k, pct := range []int{25, 50, 75} {
		t.Logf("at %d%%: mean |error| %.1f%%, bias %+.1f%%; count-based %.1f%%", pct, 100*abs[k], 100*bias[k], 100*naive[k])
		if abs[k] > 0.45 || math.Abs(bias[k]) > 0.2 {
			t.Errorf("at %d%% of the plan the ETA is off by %.1f%% on average (bias %+.1f%%)", pct, 100*abs[k], 100*bias[k])
		}
		if abs[k] >= naive[k] {
			t.Errorf("at %d%% of the plan the ETA (%.1f%% off) is no better than counting modules (%.1f%%)", pct, 100*abs[k], 100*naive[k])
		}
	}
}

// BenchmarkETA1000On50 reports the ETA's error (estimated remaining time
// against the real one, in %) at 25/50/75% of a plan of the 1,000-module
// DAG, over 10 seeds, build times noisy around their estimates (lognormal
// σ 0.3 and 0.6), next to a progress bar's count-based extrapolation. On
// 50 machines the plan is bound by its critical path; on 10 by its work,
// where the forecast without the machines bound (path-only) shows what it
// adds.
func BenchmarkETA1000On50(b *testing.B) {
	for _, tc := range []struct {
		name                       string
		sigma                      float64
		machines, forecastMachines int
	}{
		{"sigma-0.3/on-50", 0.3, 50, 50},
		{"sigma-0.6/on-50", 0.6, 50, 50},
		{"sigma-0.3/on-10", 0.3, 10, 10},
		{"sigma-0.3/on-10/path-only", 0.3, 10, 0},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var abs, bias, naive [3]float64
			for b.Loop() {
				abs, bias, naive = etaErrors(b, tc.sigma, 10, tc.machines, tc.forecastMachines)
			}
			for k, pct := range []string{"25", "50", "75"} {
				b.ReportMetric(100*abs[k], "abs%@"+pct)
				b.ReportMetric(100*bias[k], "bias%@"+pct)
				b.ReportMetric(100*naive[k], "count-abs%@"+pct)
			}
		})
	}
}
