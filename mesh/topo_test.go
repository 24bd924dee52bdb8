package mesh

import (
	"iter"
	"slices"
	"testing"
)

func TestTopoOrdersBasesFirstAndReportsCycles(t *testing.T) {
	// 0 ← 1 ← 3, 0 ← 2 ← 3 (a diamond), 4 alone.
	bases := [][]int{nil, {0}, {0}, {1, 2}, nil}
	deps := [][]int{{1, 2}, {3}, {3}, nil, nil}
	order, cyclic := Topo(len(bases), adj(bases), adj(deps))
	if want := []int{0, 4, 1, 2, 3}; !slices.Equal(order, want) || cyclic != nil {
		t.Fatalf("order %v cyclic %v, want %v and none", order, cyclic, want)
	}
	// 1 ↔ 2 form a cycle; 3 is built on it; 0 is free.
	bases = [][]int{nil, {2}, {1}, {2}}
	deps = [][]int{nil, {2}, {1, 3}, nil}
	order, cyclic = Topo(len(bases), adj(bases), adj(deps))
	if !slices.Equal(order, []int{0}) || !slices.Equal(cyclic, []int{1, 2, 3}) {
		t.Fatalf("order %v cyclic %v, want [0] and [1 2 3]", order, cyclic)
	}
}

func adj(list [][]int) func(int) iter.Seq[int] {
	return func(i int) iter.Seq[int] { return Indices(list[i]) }
}
