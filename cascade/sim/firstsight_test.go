package sim

import (
	"math"
	"slices"
	"testing"
)

// The estimators keep what is known and fill in the rest from what they
// say they use.
func TestFirstSightEstimators(t *testing.T) {
	// m0 → m1, m2, m3 (siblings); m1, m2 → m4.
	d := DAG{Names: []string{"m0", "m1", "m2", "m3", "m4"}, Bases: [][]int{nil, {0}, {0}, {0}, {1, 2}},
		Dur: []float64{2, 1, 3, 8, 5}}
	known := []bool{true, true, true, false, false}
	unit := UnitFill(d, known)
	if want := []float64{2, 1, 3, 2, 2}; !slices.Equal(unit, want) {
		t.Errorf("UnitFill = %v, want %v (the mean of the known, 2)", unit, want)
	}
	if got, want := SiblingFill(d, known), []float64{2, 1, 3, 3, 2}; !slices.Equal(got, want) {
		t.Errorf("SiblingFill = %v, want %v (m3: its siblings' median, 3; m4 has none: the mean)", got, want)
	}
	if got, want := BaseFill(d, known), []float64{2, 1, 3, 2, 2}; !slices.Equal(got, want) {
		t.Errorf("BaseFill = %v, want %v (m3: m0's 2; m4: the mean of m1 and m2, 2)", got, want)
	}
	// Nothing known: every fill is path length in modules.
	none := make([]bool, d.Len())
	for _, f := range []Estimator{UnitFill, SiblingFill, BaseFill} {
		if got := f(d, none); !slices.Equal(got, []float64{1, 1, 1, 1, 1}) {
			t.Errorf("nothing known: %v, want all 1", got)
		}
	}
	// The expected path: with everything known every draw is the true
	// durations, so its estimates are they; with something unknown the
	// unknown get positive estimates and the known keep theirs where their
	// rank is not decided by a draw ahead of them.
	all := []bool{true, true, true, true, true}
	if got := ExpectedPathFill(1, 50, 3)(d, all); !close(got, d.Dur) {
		t.Errorf("everything known: ExpectedPathFill = %v, want the durations %v", got, d.Dur)
	}
	est := ExpectedPathFill(1, 400, 3)(d, known)
	if est[3] <= 0 || est[4] <= 0 || math.Abs(est[2]-3) > 1e-9 {
		t.Errorf("ExpectedPathFill = %v: want m3 and m4 positive and m2's 3 kept (its rank is its 3 plus m4's expected one)", est)
	}
}

func close(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-9 {
			return false
		}
	}
	return true
}

// BenchmarkFirstSight measures the first-sight estimators (firstsight.go)
// by the makespan of the controller's default policy (a window of 1: the
// best held ask published as a machine takes one; aged as the controller
// ages, ControllerAging) ranked by each, divided
// by list scheduling with the true durations, longest path first (mean
// over the DAGs). The DAGs are the scheduling benchmarks': the fan of 35
// on 4 (3 seeds, lognormal σ 1) and the 1,000-module layered DAG on 50
// (seed 1, as BenchmarkControllerDAG1000On50, and seeds 0-9). Nothing known
// (nothing-*), and one module in ten never built among known ones
// (tenth-*); nothing-unit-unaged is the controller's policy without
// aging. MESHBUILD_BENCH=tiny: two seeds, 20 draws.
func BenchmarkFirstSight(b *testing.B) {
	var fan, dag1, dag10 []DAG
	for seed := range uint64(3) {
		fan = append(fan, Fan(35).Lognormal(seed, 1))
	}
	dag1 = []DAG{RandomLayeredDAG(1000, 10, 1)}
	seeds, draws := uint64(10), 200
	if benchTiny() {
		seeds, draws = 2, 20
	}
	for seed := range seeds {
		dag10 = append(dag10, RandomLayeredDAG(1000, 10, seed))
	}
	estimators := []struct {
		name string
		e    Estimator
	}{
		{"unit", UnitFill},
		{"sibling", SiblingFill},
		{"base", BaseFill},
		{"expected-path", ExpectedPathFill(1, draws, 7)},
	}
	for _, set := range []struct {
		name     string
		dags     []DAG
		machines int
	}{{"fan35on4", fan, 4}, {"dag1000on50-seed1", dag1, 50}, {"dag1000on50-10seeds", dag10, 50}} {
		b.Run(set.name, func(b *testing.B) {
			for b.Loop() {
				for _, share := range []struct {
					name  string
					share float64
				}{{"nothing", 1}, {"tenth", 0.1}} {
					for _, e := range estimators {
						var sum float64
						for k, d := range set.dags {
							known := Unknown(d, share.share, uint64(k)+1)
							p := Policy{Window: 1, Estimates: e.e(d, known), Aging: ControllerAging}
							if share.share == 1 {
								// Nothing known: the controller's ranks
								// count modules (every fill is 1).
								p.Estimates, p.UnitEstimates = nil, true
							}
							got := Simulate(d, set.machines, p).Makespan
							list := Simulate(d, set.machines, Policy{Order: Priority}).Makespan
							sum += got / list
						}
						b.ReportMetric(sum/float64(len(set.dags)), share.name+"-"+e.name+"/list")
						if share.share == 1 && e.name == "unit" {
							// The controller's policy before it aged asks.
							sum = 0
							for _, d := range set.dags {
								sum += Simulate(d, set.machines, Policy{Window: 1, UnitEstimates: true}).Makespan /
									Simulate(d, set.machines, Policy{Order: Priority}).Makespan
							}
							b.ReportMetric(sum/float64(len(set.dags)), "nothing-unit-unaged/list")
						}
					}
				}
			}
		})
	}
}
