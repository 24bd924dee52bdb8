package sim

import (
	"testing"
)

// BenchmarkFirstSight measures the first-sight estimators (firstsight.go)
// by the makespan of the controller's default policy (a window of 1: the
// best held ask published as a machine takes one) ranked by each, divided
// by list scheduling with the true durations, longest path first (mean
// over the DAGs). The DAGs are the scheduling benchmarks': the fan of 35
// on 4 (3 seeds, lognormal σ 1) and the 1,000-module layered DAG on 50
// (seed 1, as BenchmarkControllerDAG1000On50, and seeds 0-9). Nothing known
// (nothing-*), and one module in ten never built among known ones
// (tenth-*).
func BenchmarkFirstSight(b *testing.B) {
	var fan, dag1, dag10 []DAG
	for seed := range uint64(3) {
		fan = append(fan, Fan(35).Lognormal(seed, 1))
	}
	dag1 = []DAG{RandomLayeredDAG(1000, 10, 1)}
	for seed := range uint64(10) {
		dag10 = append(dag10, RandomLayeredDAG(1000, 10, seed))
	}
	estimators := []struct {
		name string
		e    Estimator
	}{
		{"unit", UnitFill},
		{"sibling", SiblingFill},
		{"base", BaseFill},
		{"expected-path", ExpectedPathFill(1, 200, 7)},
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
							est := e.e(d, known)
							got := Simulate(d, set.machines, Policy{Window: 1, Estimates: est}).Makespan
							list := Simulate(d, set.machines, Policy{Order: Priority}).Makespan
							sum += got / list
						}
						b.ReportMetric(sum/float64(len(set.dags)), share.name+"-"+e.name+"/list")
					}
				}
			}
		})
	}
}
