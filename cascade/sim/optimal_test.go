package sim

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestOptimalByHand(t *testing.T) {
	tests := []struct {
		name     string
		d        DAG
		machines int
		// optimum is computed by hand; list is the list schedule
		// (Simulate, Priority) of the same DAG.
		optimum, list float64
	}{
		{
			// Five independent builds 3, 3, 2, 2, 2 on two machines:
			// longest first puts the 3s apart and ends at 3+2+2 = 7;
			// {3, 3} and {2, 2, 2} end at 6.
			name:     "longest first is not optimal",
			d:        DAG{Names: []string{"a", "b", "c", "d", "e"}, Bases: make([][]int, 5), Dur: []float64{3, 3, 2, 2, 2}},
			machines: 2, optimum: 6, list: 7,
		},
		{
			// A base and seven builds of 1 on three machines: the base
			// alone, then ⌈7/3⌉ = 3 rounds.
			name: "fan of 7 on 3", d: Fan(7), machines: 3, optimum: 4, list: 4,
		},
		{
			// A diamond 1 → (2, 3) → 4 on two machines: the critical path
			// 1 + 3 + 4 = 8.
			name:     "diamond",
			d:        DAG{Names: []string{"a", "b", "c", "d"}, Bases: [][]int{nil, {0}, {0}, {1, 2}}, Dur: []float64{1, 2, 3, 4}},
			machines: 2, optimum: 8, list: 8,
		},
		{
			// Three machines, a chain a(1) → b(1) → c(3) and six leaves of
			// 1: work 11, so ⌈11/3⌉ is not reachable because the chain
			// takes 5 and ends the schedule; the leaves fit beside it. 5.
			name: "chain and leaves on three",
			d: DAG{Names: []string{"a", "b", "c", "l1", "l2", "l3", "l4", "l5", "l6"},
				Bases: [][]int{nil, {0}, {1}, nil, nil, nil, nil, nil, nil},
				Dur:   []float64{1, 1, 3, 1, 1, 1, 1, 1, 1}},
			machines: 3, optimum: 5, list: 5,
		},
		{
			// Four machines, ten builds: two bases of 2, each with four
			// dependents of 3. Bases at 0 on two machines, the other two
			// idle until 2; then eight 3s on four machines: 2 + 6 = 8.
			name: "two fans on four",
			d: DAG{Names: []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"},
				Bases: [][]int{nil, nil, {0}, {0}, {0}, {0}, {1}, {1}, {1}, {1}},
				Dur:   []float64{2, 2, 3, 3, 3, 3, 3, 3, 3, 3}},
			machines: 4, optimum: 8, list: 8,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Optimal(tc.d, tc.machines)
			if err != nil {
				t.Fatal(err)
			}
			if !near(o.Makespan, tc.optimum) {
				t.Errorf("optimal %v, want %v", o.Makespan, tc.optimum)
			}
			if l := Simulate(tc.d, tc.machines, Policy{Order: Priority}).Makespan; !near(l, tc.list) {
				t.Errorf("list schedule %v, want %v", l, tc.list)
			}
		})
	}
}

// TestOptimalIdlesWhenThatIsBest: the optimum keeps a machine idle while
// builds are ready, so no list schedule (which never does), whatever its
// list, reaches it. Two machines; a (2) is the base of b (2), c (2) and
// top (5), top also on b and c; long (4) and short (1) are leaves. The
// critical path a, b, top is 9, and 9 is reached only by one machine
// building a, b, top while the other builds short, waits for a, then c
// and long: any list schedule starts long or short at 0 and a leaf is in
// the way when b and c are released. The best list schedule is 11.
func TestOptimalIdlesWhenThatIsBest(t *testing.T) {
	d := DAG{Names: []string{"a", "b", "c", "long", "short", "top"},
		Bases: [][]int{nil, {0}, {0}, nil, nil, {0, 1, 2}},
		Dur:   []float64{2, 2, 2, 4, 1, 5}}
	o, err := Optimal(d, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !near(o.Makespan, 9) || !near(o.LowerBound, 9) {
		t.Errorf("optimal %v (bound %v), want 9 (9)", o.Makespan, o.LowerBound)
	}
	if l := bestListSchedule(d, 2); !near(l, 11) {
		t.Errorf("best list schedule %v, want 11", l)
	}
	if l := Simulate(d, 2, Policy{Order: Priority}).Makespan; !near(l, 11) {
		t.Errorf("longest path first %v, want 11", l)
	}
}

// bestListSchedule is the shortest list schedule over every list: each
// machine, when free, starts the first ready build of the list.
func bestListSchedule(d DAG, m int) float64 {
	n := d.Len()
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	best := math.Inf(1)
	var permute func(k int)
	permute = func(k int) {
		if k == n {
			pos := make([]int, n)
			for i, x := range perm {
				pos[x] = i
			}
			best = min(best, listSchedule(d, m, pos))
			return
		}
		for i := k; i < n; i++ {
			perm[k], perm[i] = perm[i], perm[k]
			permute(k + 1)
			perm[k], perm[i] = perm[i], perm[k]
		}
	}
	permute(0)
	return best
}

// listSchedule: whenever a machine is free, it starts the ready build
// first in the list (pos is each build's place in it).
func listSchedule(d DAG, m int, pos []int) float64 {
	n := d.Len()
	finish := make([]float64, n)
	started := make([]bool, n)
	free := make([]float64, m)
	now, end := 0.0, 0.0
	for count := 0; count < n; {
		for k := range m {
			if free[k] > now {
				continue
			}
			pick := -1
			for i := range n {
				ready := !started[i]
				for _, b := range d.Bases[i] {
					ready = ready && started[b] && finish[b] <= now
				}
				if ready && (pick < 0 || pos[i] < pos[pick]) {
					pick = i
				}
			}
			if pick >= 0 {
				started[pick], finish[pick], free[k] = true, now+d.Dur[pick], now+d.Dur[pick]
				end = max(end, finish[pick])
				count++
			}
		}
		next := math.Inf(1)
		for i := range n {
			if started[i] && finish[i] > now {
				next = min(next, finish[i])
			}
		}
		now = next
	}
	return end
}

func TestOptimalMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 60 {
		n := 3 + rng.IntN(4) // 3..6 nodes
		d := DAG{Names: make([]string, n), Bases: make([][]int, n), Dur: make([]float64, n)}
		for i := range n {
			d.Names[i] = simName(i, n)
			for b := range i {
				if rng.IntN(3) == 0 {
					d.Bases[i] = append(d.Bases[i], b)
				}
			}
			d.Dur[i] = float64(1 + rng.IntN(5))
		}
		for _, m := range []int{1, 2, 3} {
			o, err := Optimal(d, m)
			if err != nil {
				t.Fatal(err)
			}
			if want := bruteForce(d, m); !near(o.Makespan, want) {
				t.Fatalf("trial %d on %d: Optimal %v, brute force %v: %+v", trial, m, o.Makespan, want, d)
			}
			for _, p := range []Policy{{Order: Priority}, {Order: FIFO}, {Order: Ranked}, {Barrier: true}} {
				if s := Simulate(d, m, p).Makespan; s < o.Makespan-1e-9 {
					t.Fatalf("trial %d on %d: %+v gives %v, under the optimum %v", trial, m, p, s, o.Makespan)
				}
			}
			if l := bestListSchedule(d, m); o.Makespan > l+1e-9 {
				t.Fatalf("trial %d on %d: Optimal %v, above the best list schedule %v", trial, m, o.Makespan, l)
			}
			if o.Makespan < o.LowerBound-1e-9 {
				t.Fatalf("optimum %v under the lower bound %v", o.Makespan, o.LowerBound)
			}
		}
	}
}

// bruteForce tries every order of starts that respects the bases and every
// machine for each build, each build starting when its machine is free and
// its bases built: every left-shifted schedule, without pruning.
func bruteForce(d DAG, m int) float64 {
	n := d.Len()
	best := d.Work() + 1
	finish := make([]float64, n)
	done := make([]bool, n)
	free := make([]float64, m)
	var rec func(count int, end float64)
	rec = func(count int, end float64) {
		if count == n {
			best = min(best, end)
			return
		}
		for i := range n {
			if done[i] {
				continue
			}
			ready, ok := 0.0, true
			for _, b := range d.Bases[i] {
				if !done[b] {
					ok = false
				}
				ready = max(ready, finish[b])
			}
			if !ok {
				continue
			}
			for k := range m {
				start := max(ready, free[k])
				saved := free[k]
				free[k], finish[i], done[i] = start+d.Dur[i], start+d.Dur[i], true
				rec(count+1, max(end, start+d.Dur[i]))
				free[k], done[i] = saved, false
			}
		}
	}
	rec(0, 0)
	return best
}

func TestOptimalLimits(t *testing.T) {
	if _, err := Optimal(Fan(MaxOptimal), 2); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a DAG of %d nodes: %v", MaxOptimal+1, err)
	}
	if _, err := Optimal(Fan(2), 0); err == nil {
		t.Error("no machine: no error")
	}
	// Ten random modules on two to four machines finish quickly.
	t0 := time.Now()
	for seed := range uint64(10) {
		for m := 2; m <= 4; m++ {
			if _, err := Optimal(RandomLayeredDAG(10, 3, seed), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("30 optimal schedules of 10 modules in %s", time.Since(t0))
}

func TestJitter(t *testing.T) {
	d := RandomLayeredDAG(1000, 10, 1)
	j := d.Jitter(7, 0.18)
	if j.Len() != d.Len() || &j.Bases[0] != &d.Bases[0] {
		t.Fatal("Jitter changed the graph")
	}
	within := 0
	for i := range d.Dur {
		r := j.Dur[i] / d.Dur[i]
		if r <= 0 {
			t.Fatal("non-positive factor")
		}
		if r >= 1/1.2 && r <= 1.2 {
			within++
		}
	}
	// σ = 0.18: P(|N| ≤ ln 1.2 / 0.18 ≈ 1.01) ≈ 0.69.
	if within < 630 || within > 750 {
		t.Errorf("%d of 1000 factors within ±20 %%", within)
	}
	if k := d.Jitter(7, 0.18); k.Dur[5] != j.Dur[5] {
		t.Error("same seed, different factors")
	}
	if k := d.Jitter(8, 0.18); k.Dur[5] == j.Dur[5] {
		t.Error("different seeds, same factors")
	}
}

// BenchmarkListVersusOptimal: how far list scheduling, longest path first
// (Policy{Order: Priority}, the schedule the benchmarks call the list
// schedule) is from the exact optimum, on 100 random 10-module DAGs
// (RandomLayeredDAG(10, 3, seed): lognormal durations, σ = 1) on 2, 3 and
// 4 machines: the mean and the worst of list ÷ optimum (1: the list
// schedule is optimal), and how many of the 300 it left above the
// optimum.
func BenchmarkListVersusOptimal(b *testing.B) {
	dags := 100
	if benchTiny() {
		dags = 5
	}
	var mean, worst, above float64
	n := 0
	for b.Loop() {
		mean, worst, above, n = 0, 0, 0, 0
		for seed := range uint64(dags) {
			d := RandomLayeredDAG(10, 3, seed)
			for m := 2; m <= 4; m++ {
				o, err := Optimal(d, m)
				if err != nil {
					b.Fatal(err)
				}
				l := Simulate(d, m, Policy{Order: Priority}).Makespan
				if l < o.Makespan-1e-9 {
					b.Fatalf("seed %d on %d: list %v under the optimum %v", seed, m, l, o.Makespan)
				}
				r := l / o.Makespan
				mean += r
				worst = max(worst, r)
				if r > 1+1e-9 {
					above++
				}
				n++
			}
		}
	}
	b.ReportMetric(mean/float64(n), "list/optimal")
	b.ReportMetric(worst, "worst-list/optimal")
	b.ReportMetric(above, "above-optimal")
	b.ReportMetric(float64(n), "cases")
}

func TestTightBound(t *testing.T) {
	// Fan(35) on 4: the base (1), then 35 on 4: 1 + 35/4 = 9.75, where
	// LowerBound says 9.
	if got := TightBound(Fan(35), 4); !near(got, 9.75) {
		t.Errorf("fan 35 on 4: %v, want 9.75", got)
	}
	// An inverted fan: 6 leaves of 1 under one top of 2, on 3 machines:
	// the leaves (6 ÷ 3) then the top: 4, where LowerBound says 8 ÷ 3.
	inv := DAG{Names: []string{"a", "b", "c", "d", "e", "f", "top"},
		Bases: [][]int{nil, nil, nil, nil, nil, nil, {0, 1, 2, 3, 4, 5}}, Dur: []float64{1, 1, 1, 1, 1, 1, 2}}
	if got := TightBound(inv, 3); !near(got, 4) {
		t.Errorf("inverted fan: %v, want 4", got)
	}
	// Never above the optimum, never below LowerBound.
	rng := rand.New(rand.NewPCG(9, 9))
	for trial := range 80 {
		d := RandomLayeredDAG(3+rng.IntN(6), 1+rng.IntN(4), uint64(trial))
		for m := 1; m <= 4; m++ {
			o, err := Optimal(d, m)
			if err != nil {
				t.Fatal(err)
			}
			if b := TightBound(d, m); b > o.Makespan+1e-9 || b < LowerBound(d, m)-1e-9 {
				t.Fatalf("trial %d on %d: bound %v, optimum %v, LowerBound %v", trial, m, b, o.Makespan, LowerBound(d, m))
			}
		}
	}
}
