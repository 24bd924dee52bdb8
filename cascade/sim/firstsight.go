package sim

import (
	"math"
	"math/rand/v2"
	"slices"
)

// # First sight: estimates of durations not yet known
//
// A plan's asks are ranked by their remaining critical path in estimated
// durations; a module never built has no duration of its own. The
// estimators below are what can stand in for it — from the graph alone
// when nothing is known, from the known durations around it when some are
// — and BenchmarkFirstSight measures each against list scheduling with the
// true durations on the benchmark DAGs.

// Estimator fills in the durations of the modules not known (known[i]
// false) from the DAG and the known durations (d.Dur at the known
// indices); it returns estimates for every module, the known ones as they
// are.
type Estimator func(d DAG, known []bool) []float64

// UnitFill counts every module not known as the mean of the known
// durations (1 when none is known): what State does (its computeRanks),
// and with nothing known the rank is the path length in modules.
func UnitFill(d DAG, known []bool) []float64 {
	est := slices.Clone(d.Dur)
	var sum float64
	n := 0
	for i, k := range known {
		if k {
			sum += d.Dur[i]
			n++
		}
	}
	fill := 1.0
	if n > 0 {
		fill = sum / float64(n)
	}
	for i, k := range known {
		if !k {
			est[i] = fill
		}
	}
	return est
}

// SiblingFill counts a module not known as the median of the known
// durations of its siblings (the modules built on exactly the same bases),
// else as UnitFill does.
func SiblingFill(d DAG, known []bool) []float64 {
	est := UnitFill(d, known)
	groups := map[string][]int{}
	keyOf := func(i int) string {
		bs := slices.Clone(d.Bases[i])
		slices.Sort(bs)
		k := ""
		for _, b := range bs {
			k += d.Names[b] + ","
		}
		return k
	}
	for i := range d.Names {
		groups[keyOf(i)] = append(groups[keyOf(i)], i)
	}
	for i, k := range known {
		if k {
			continue
		}
		var ds []float64
		for _, j := range groups[keyOf(i)] {
			if known[j] {
				ds = append(ds, d.Dur[j])
			}
		}
		if len(ds) > 0 {
			slices.Sort(ds)
			est[i] = ds[len(ds)/2]
		}
	}
	return est
}

// BaseFill counts a module not known as the mean of its bases' known
// durations, else as UnitFill does.
func BaseFill(d DAG, known []bool) []float64 {
	est := UnitFill(d, known)
	for i, k := range known {
		if k {
			continue
		}
		var sum float64
		n := 0
		for _, b := range d.Bases[i] {
			if known[b] {
				sum += d.Dur[b]
				n++
			}
		}
		if n > 0 {
			est[i] = sum / float64(n)
		}
	}
	return est
}

// ExpectedPathFill ranks by the expected remaining critical path when the
// durations not known are independent lognormal draws (median the known
// ones' geometric mean, or 1, and spread sigma): the mean over draws of
// each module's remaining critical path, returned as the estimates whose
// ranks those are. A module with many long chains ahead of it ranks above
// one with a single chain of the same length: the longest of many draws
// is longer than one.
func ExpectedPathFill(sigma float64, draws int, seed uint64) Estimator {
	return func(d DAG, known []bool) []float64 {
		rng := rand.New(rand.NewPCG(seed, seed^0x243f6a8885a308d3))
		var lsum float64
		n := 0
		for i, k := range known {
			if k && d.Dur[i] > 0 {
				lsum += math.Log(d.Dur[i])
				n++
			}
		}
		median := 1.0
		if n > 0 {
			median = math.Exp(lsum / float64(n))
		}
		acc := make([]float64, d.Len())
		draw := make([]float64, d.Len())
		for range draws {
			for i, k := range known {
				if k {
					draw[i] = d.Dur[i]
				} else {
					draw[i] = median * math.Exp(sigma*rng.NormFloat64())
				}
			}
			for i, r := range d.ranks(draw) {
				acc[i] += r / float64(draws)
			}
		}
		return d.estimatesOf(acc)
	}
}

// estimatesOf are the estimates whose ranks (DAG.ranks) are rank: each
// module's rank less the highest of its dependents'.
func (d DAG) estimatesOf(rank []float64) []float64 {
	deps := d.dependents()
	est := make([]float64, d.Len())
	for i := range est {
		longest := 0.0
		for _, x := range deps[i] {
			longest = max(longest, rank[x])
		}
		est[i] = rank[i] - longest
	}
	return est
}

// Unknown marks a share of d's modules not known (seeded): known[i] false
// for about share of them.
func Unknown(d DAG, share float64, seed uint64) []bool {
	rng := rand.New(rand.NewPCG(seed, seed^0x13198a2e03707344))
	known := make([]bool, d.Len())
	for i := range known {
		known[i] = rng.Float64() >= share
	}
	return known
}
