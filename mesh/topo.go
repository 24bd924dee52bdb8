package mesh

import "iter"

// Topo is the one topological order over build.on: the planner's tiers, the
// cascade's release ranks and the simulator all order modules with it.
// Nodes are 0..n-1; bases(i) yields the nodes node i is built on, and
// dependents(i) the nodes built on node i (the same edges, reversed). The
// order is Kahn's: bases first, and among the nodes made free together the
// lower index first, so the same graph always gives the same order.
//
// A graph with a cycle has no complete order: cyclic lists, ascending, the
// nodes left out (those on a cycle or built on one), and order holds the
// rest. The catalogue check refuses cycles (and names them, see cycles in
// check_cycles.go), so cyclic is empty for any checked catalogue.
func Topo(n int, bases, dependents func(i int) iter.Seq[int]) (order, cyclic []int) {
	indeg := make([]int, n)
	for i := range n {
		for range bases(i) {
			indeg[i]++
		}
	}
	order = make([]int, 0, n)
	for i := range n {
		if indeg[i] == 0 {
			order = append(order, i)
		}
	}
	for k := 0; k < len(order); k++ {
		for d := range dependents(order[k]) {
			if indeg[d]--; indeg[d] == 0 {
				order = append(order, d)
			}
		}
	}
	if len(order) < n {
		for i := range n {
			if indeg[i] > 0 {
				cyclic = append(cyclic, i)
			}
		}
	}
	return order, cyclic
}

// Indices yields the elements of an adjacency list as ints: the adapter
// from a [][]int or [][]int32 to Topo's edges.
func Indices[I ~int | ~int32](list []I) iter.Seq[int] {
	return func(yield func(int) bool) {
		for _, v := range list {
			if !yield(int(v)) {
				return
			}
		}
	}
}
