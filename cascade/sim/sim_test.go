package sim

import (
	"math"
	"reflect"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(a), math.Abs(b)) }

func TestSimulateByHand(t *testing.T) {
	// Two roots: a (1) and b (10); c (1) on a; 2 machines. The cascade
	// builds c while b is still building; the barrier waits for b.
	d := DAG{Names: []string{"a", "b", "c"}, Bases: [][]int{nil, nil, {0}}, Dur: []float64{1, 10, 1}}
	// A diamond on one machine is its total work.
	diamond := DAG{Names: []string{"a", "b", "c", "d"}, Bases: [][]int{nil, {0}, {0}, {1, 2}}, Dur: []float64{1, 2, 3, 4}}
	// One machine: every order is the total work.
	chain := DAG{Names: []string{"r", "x", "y", "z"}, Bases: [][]int{nil, {0}, {0}, {2}}, Dur: []float64{1, 1, 1, 1}}
	tests := []struct {
		name     string
		d        DAG
		machines int
		p        Policy
		makespan float64
		lb       float64
	}{
		{"cascade", d, 2, Policy{}, 10, 10},
		{"barrier", d, 2, Policy{Barrier: true}, 11, 10},
		{"diamond on one", diamond, 1, Policy{}, 10, 10},
		{"diamond on two", diamond, 2, Policy{}, 8, 8},
		{"diamond barrier", diamond, 2, Policy{Barrier: true}, 8, 8},
		{"fan 35 on 4", Fan(35), 4, Policy{}, 10, 9},
		{"fan 35 on 4 barrier", Fan(35), 4, Policy{Barrier: true}, 10, 9},
		{"fan 35 on 40", Fan(35), 40, Policy{}, 2, 2},
		{"fifo on one", chain, 1, Policy{Order: FIFO}, 4, 4},
		{"priority on one", chain, 1, Policy{Order: Priority}, 4, 4},
		{"chain beside a leaf", DAG{Names: []string{"r", "a", "b", "c", "d"}, Bases: [][]int{nil, {0}, {0}, {2}, {3}},
			Dur: []float64{1, 1, 1, 1, 1}}, 2, Policy{Order: FIFO}, 4, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Simulate(tc.d, tc.machines, tc.p)
			if !near(r.Makespan, tc.makespan) || !near(r.LowerBound, tc.lb) {
				t.Fatalf("makespan %v lb %v, want %v %v", r.Makespan, r.LowerBound, tc.makespan, tc.lb)
			}
		})
	}
}

func TestFIFOVersusRanked(t *testing.T) {
	// r releases two leaves and the head of a chain, on two machines. FIFO
	// (name order) builds the leaves first and the chain last (1+2+2+2);
	// ranked starts the chain beside a leaf (1+2+2).
	d := DAG{
		Names: []string{"a-leaf", "b-leaf", "c-chain", "d-chain", "r"},
		Bases: [][]int{{4}, {4}, {4}, {2}, nil},
		Dur:   []float64{2, 2, 2, 2, 1},
	}
	fifo := Simulate(d, 2, Policy{Order: FIFO})
	ranked := Simulate(d, 2, Policy{Order: Ranked})
	if !near(fifo.Makespan, 7) || !near(ranked.Makespan, 5) {
		t.Fatalf("fifo %v ranked %v, want 7 and 5", fifo.Makespan, ranked.Makespan)
	}
}

func TestPoliciesRespectTheLowerBound(t *testing.T) {
	policies := []Policy{{}, {Order: Ranked}, {Order: Priority}, {Order: Ranked, UnitEstimates: true}, {Barrier: true},
		{Barrier: true, Order: Ranked}, {Window: 1}, {Window: 4, UnitEstimates: true}}
	for seed := range uint64(20) {
		d := RandomLayeredDAG(300, 6, seed)
		for _, machines := range []int{1, 3, 20, 1000} {
			for _, p := range policies {
				r := Simulate(d, machines, p)
				if r.Makespan < r.LowerBound-1e-9 || r.Ratio() < 1-1e-12 {
					t.Fatalf("seed %d, %d machines, %+v: makespan %v under the bound %v", seed, machines, p, r.Makespan, r.LowerBound)
				}
				if machines == 1 && !near(r.Makespan, d.Work()) {
					t.Fatalf("one machine: makespan %v, work %v", r.Makespan, d.Work())
				}
				if machines == 1000 && !p.Barrier && !near(r.Makespan, d.CriticalPath()) {
					t.Fatalf("unbounded machines: cascade makespan %v, critical path %v", r.Makespan, d.CriticalPath())
				}
			}
		}
	}
}

func TestRandomLayeredDAG(t *testing.T) {
	d := RandomLayeredDAG(1000, 10, 7)
	if !reflect.DeepEqual(d, RandomLayeredDAG(1000, 10, 7)) {
		t.Fatal("same seed, different DAG")
	}
	if reflect.DeepEqual(d.Dur, RandomLayeredDAG(1000, 10, 8).Dur) {
		t.Fatal("different seeds, same DAG")
	}
	if d.Len() != 1000 {
		t.Fatal(d.Len())
	}
	p, err := d.Plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Modules) != 1000 || len(p.Tiers) != 10 {
		t.Fatalf("plan of %d modules in %d tiers", len(p.Modules), len(p.Tiers))
	}
	for k, tier := range p.Tiers {
		if len(tier) != 100 {
			t.Errorf("tier %d has %d modules", k, len(tier))
		}
	}
	// The median duration is about 1.
	var below int
	for _, x := range d.Dur {
		if x <= 0 {
			t.Fatal("non-positive duration")
		}
		if x < 1 {
			below++
		}
	}
	if below < 420 || below > 580 {
		t.Errorf("%d of 1000 durations below the median 1", below)
	}
	back := FromPlan(p, nil)
	if back.Len() != 1000 || back.Work() != 1000 {
		t.Errorf("FromPlan: %d nodes, work %v", back.Len(), back.Work())
	}
	if got := RandomLayeredDAG(5, 0, 1).Len(); got != 5 {
		t.Errorf("zero layers: %d", got)
	}
	if got := Fan(3).Lognormal(1, 1); reflect.DeepEqual(got.Dur, Fan(3).Dur) || !reflect.DeepEqual(got.Bases, Fan(3).Bases) {
		t.Error("Lognormal")
	}
}

// ratios simulates each DAG and returns the mean and the worst
// makespan / lower bound.
func ratios(dags []DAG, machines int, p Policy) (mean, worst float64) {
	for _, d := range dags {
		r := Simulate(d, machines, p).Ratio()
		mean += r
		worst = max(worst, r)
	}
	return mean / float64(len(dags)), worst
}

func benchPolicies(b *testing.B, dags []DAG, machines int, policies []struct {
	name string
	p    Policy
}) {
	for _, pc := range policies {
		b.Run(pc.name, func(b *testing.B) {
			var mean, worst float64
			for b.Loop() {
				mean, worst = ratios(dags, machines, pc.p)
			}
			b.ReportMetric(mean, "makespan/lb")
			if len(dags) > 1 {
				b.ReportMetric(worst, "worst-makespan/lb")
			}
		})
	}
}

type namedPolicy = struct {
	name string
	p    Policy
}

// BenchmarkFan35On4: one base, 35 dependents, 4 machines. The bound
// max(critical path, work/4) ignores that the base is built alone, so even
// the best schedule is above 1 here.
func BenchmarkFan35On4(b *testing.B) {
	policies := []namedPolicy{
		{"cascade", Policy{}},
		{"cascade-ranked", Policy{Order: Ranked}},
		{"barrier", Policy{Barrier: true}},
	}
	b.Run("equal", func(b *testing.B) { benchPolicies(b, []DAG{Fan(35)}, 4, policies) })
	var logn []DAG
	for seed := range uint64(100) {
		logn = append(logn, Fan(35).Lognormal(seed, 1))
	}
	b.Run("lognormal", func(b *testing.B) { benchPolicies(b, logn, 4, policies) })
}

// BenchmarkDAG1000On50: 1,000 modules in 10 layers, lognormal durations,
// 50 machines, over 10 seeds.
func BenchmarkDAG1000On50(b *testing.B) {
	var dags []DAG
	for seed := range uint64(10) {
		dags = append(dags, RandomLayeredDAG(1000, 10, seed))
	}
	benchPolicies(b, dags, 50, []namedPolicy{
		{"barrier", Policy{Barrier: true}},
		{"barrier-ranked", Policy{Barrier: true, Order: Ranked}},
		{"cascade-fifo", Policy{Order: FIFO}},
		{"cascade-ranked-unit", Policy{Order: Ranked, UnitEstimates: true}},
		{"cascade-ranked", Policy{Order: Ranked}},
		{"cascade-window-1", Policy{Window: 1}},
		{"cascade-window-5", Policy{Window: 5}},
		{"cascade-window-1-unit", Policy{Window: 1, UnitEstimates: true}},
		{"priority", Policy{Order: Priority}},
	})
}

// At first sight (ranks count modules) a module of the heavy tail with a
// short path waits behind every longer path until the machines are free:
// on the layered DAG of BenchmarkControllerDAG1000On50 (seed 1) a module of
// 24.8 units in the seventh tier, ready at 9.1, starts at 23.5 and ends
// the plan at 1.15 of list scheduling with the true durations. Aged by
// the time waited, it starts soon after it is ready. Where the ranks are
// durations (learned), aging keeps list scheduling's makespan.
func TestAgingStartsALongWaitingAskBeforeTheEnd(t *testing.T) {
	d := RandomLayeredDAG(1000, 10, 1)
	list := Simulate(d, 50, Policy{Order: Priority}).Makespan
	plain := Simulate(d, 50, Policy{Order: Priority, UnitEstimates: true}).Makespan / list
	aged := Simulate(d, 50, Policy{Order: Priority, UnitEstimates: true, Aging: ControllerAging}).Makespan / list
	if plain < 1.10 || aged > 1.05 {
		t.Errorf("first sight ÷ list: %.3f without aging, %.3f with; want > 1.10 and ≤ 1.05", plain, aged)
	}
	learned := Simulate(d, 50, Policy{Order: Priority, Aging: ControllerAging}).Makespan / list
	if learned > 1.005 {
		t.Errorf("ranked by the true durations, aged: %.3f of list scheduling, want ≤ 1.005", learned)
	}
}
