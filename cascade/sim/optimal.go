package sim

import (
	"fmt"
	"math"
	"slices"
)

// MaxOptimal is the largest DAG Optimal searches: beyond it the search
// may take too long to be worth it. A layered DAG of 10 nodes on 2–4
// machines takes milliseconds; many independent builds of similar length
// take longest, the bound pruning least among them.
const MaxOptimal = 12

// Optimal is the shortest schedule of d on machines, by exhaustive search
// (branch and bound) over every schedule, not only list schedules: a
// machine may stay idle while an ask is ready, if that is what is best.
// It returns an error for a DAG of more than MaxOptimal nodes.
//
// Every schedule can be shifted left until each build starts when its
// machine is free or its last base is built, whichever is later, without
// growing; such a schedule is fixed by the order of its starts and each
// build's machine. The search enumerates those, starts in non-decreasing
// order (ties by node), machines with the same free time counted once, and
// prunes a branch whose bound — the longest remaining path from each
// build's earliest start, and the remaining work over the machines — is
// not below the best found. It starts from the list schedule (Simulate,
// Priority), so it returns nothing longer.
func Optimal(d DAG, machines int) (Result, error) {
	n := d.Len()
	if machines < 1 {
		return Result{}, fmt.Errorf("optimal schedule: %d machines", machines)
	}
	if n > MaxOptimal {
		return Result{}, fmt.Errorf("optimal schedule: %d nodes, more than the %d searched exhaustively", n, MaxOptimal)
	}
	d.topo() // panics on a cycle, as Simulate does
	s := &search{
		d: d, m: machines, order: d.topo(), tail: d.ranks(d.Dur),
		finish: make([]float64, n), done: make([]bool, n), free: make([]float64, machines),
		best: Simulate(d, machines, Policy{Order: Priority}).Makespan,
		est:  make([]float64, n),
	}
	s.remaining = d.Work()
	s.dfs(0, -1, 0, 0)
	return Result{Makespan: s.best, LowerBound: LowerBound(d, machines)}, nil
}

type search struct {
	d     DAG
	m     int
	order []int
	// tail is each node's remaining critical path, itself included.
	tail      []float64
	finish    []float64
	done      []bool
	free      []float64
	est       []float64
	remaining float64
	best      float64
}

// eps keeps float noise from counting as an improvement.
const eps = 1e-9

// dfs extends a partial schedule of count nodes whose last start was
// lastStart (of node lastNode) and whose latest finish is end.
func (s *search) dfs(count, lastNode int, lastStart, end float64) {
	n := s.d.Len()
	if count == n {
		if end < s.best-eps {
			s.best = end
		}
		return
	}
	// Earliest starts of the unscheduled nodes, and the bound.
	minFree := slices.Min(s.free)
	bound := end
	minEst := math.Inf(1)
	for _, i := range s.order {
		if s.done[i] {
			continue
		}
		e := max(minFree, lastStart)
		for _, b := range s.d.Bases[i] {
			if s.done[b] {
				e = max(e, s.finish[b])
			} else {
				e = max(e, s.est[b]+s.d.Dur[b])
			}
		}
		s.est[i] = e
		minEst = min(minEst, e)
		bound = max(bound, e+s.tail[i])
	}
	capacity := s.remaining
	for _, f := range s.free {
		capacity += max(f, minEst)
	}
	bound = max(bound, capacity/float64(s.m))
	if bound >= s.best-eps {
		return
	}

	for i := range n {
		if s.done[i] {
			continue
		}
		ready := 0.0
		waiting := false
		for _, b := range s.d.Bases[i] {
			if !s.done[b] {
				waiting = true
				break
			}
			ready = max(ready, s.finish[b])
		}
		if waiting {
			continue
		}
		for k := range s.m {
			// Machines free at the same time are the same choice.
			if slices.Contains(s.free[:k], s.free[k]) {
				continue
			}
			start := max(ready, s.free[k])
			if start < lastStart-eps || (math.Abs(start-lastStart) <= eps && i < lastNode) {
				continue // not in start order: the same schedule is found in order
			}
			f := start + s.d.Dur[i]
			if f >= s.best-eps {
				continue
			}
			saved := s.free[k]
			s.free[k], s.finish[i], s.done[i] = f, f, true
			s.remaining -= s.d.Dur[i]
			s.dfs(count+1, i, start, max(end, f))
			s.remaining += s.d.Dur[i]
			s.free[k], s.done[i] = saved, false
		}
	}
}

// Jitter returns a copy of d with each duration multiplied by a factor
// drawn from a lognormal distribution of median 1 and the given σ (σ =
// 0.18 puts two thirds of the factors within ±20 %): the same modules
// built again, each taking a little more or less than last time. The same
// seed gives the same factors.
func (d DAG) Jitter(seed uint64, sigma float64) DAG {
	f := d.Lognormal(seed^0x6a09e667f3bcc909, sigma).Dur
	out := d
	out.Dur = make([]float64, len(d.Dur))
	for i := range out.Dur {
		out.Dur[i] = d.Dur[i] * f[i]
	}
	return out
}

// TightBound is a lower bound on any schedule of d on machines, at least
// LowerBound and often above it: for each node v, everything built on v
// (directly or not) starts after v is built, which is no sooner than the
// longest chain of bases before v (its head) plus v itself, so the
// schedule is at least head(v) + dur(v) + work(descendants of v) ÷
// machines; and everything v is built on (directly or not) is built before
// v starts, so it is at least work(ancestors of v) ÷ machines + the
// longest chain from v to the end. A fan's base is built alone: the bound
// counts it.
func TightBound(d DAG, machines int) float64 {
	n := d.Len()
	order := d.topo()
	deps := d.dependents()
	head := make([]float64, n) // longest chain of bases before i starts
	for _, i := range order {
		for _, b := range d.Bases[i] {
			head[i] = max(head[i], head[b]+d.Dur[b])
		}
	}
	tail := d.ranks(d.Dur) // from i's start to the end, i included
	// Descendants and ancestors as bit sets.
	words := (n + 63) / 64
	desc := make([][]uint64, n)
	anc := make([][]uint64, n)
	for k := n - 1; k >= 0; k-- {
		i := order[k]
		desc[i] = make([]uint64, words)
		for _, x := range deps[i] {
			desc[i][x/64] |= 1 << (x % 64)
			for w := range words {
				desc[i][w] |= desc[x][w]
			}
		}
	}
	for _, i := range order {
		anc[i] = make([]uint64, words)
		for _, b := range d.Bases[i] {
			anc[i][b/64] |= 1 << (b % 64)
			for w := range words {
				anc[i][w] |= anc[b][w]
			}
		}
	}
	work := func(set []uint64) float64 {
		var sum float64
		for j := range n {
			if set[j/64]&(1<<(j%64)) != 0 {
				sum += d.Dur[j]
			}
		}
		return sum
	}
	m := float64(machines)
	bound := LowerBound(d, machines)
	for i := range n {
		bound = max(bound, head[i]+d.Dur[i]+work(desc[i])/m, work(anc[i])/m+tail[i])
	}
	return bound
}
