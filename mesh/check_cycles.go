package mesh

// Cycles in build.on, each refused once and printed.

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// edge is one entry of a build.on: the module it names and its index.
type edge struct {
	to int32
	on int32
}

// cycles refuses every cycle in build.on, one problem per strongly connected
// component, printed from the component's first module by name along the
// shortest way back to it.
//
// This is the one walk over build.on that is not Topo: Topo tells which
// modules are on or below some cycle, while a refusal must name each cycle
// itself (every component, and only its members), which takes Tarjan's
// strongly connected components.
func (c *checker) cycles(first []*Manifest) {
	nodes, adj := onGraph(first)
	type report struct {
		m     *Manifest
		field string
		msg   string
	}
	var reports []report
	w := newCycleWalk(len(nodes))
	for ci, members := range components(adj) {
		start := members[0]
		for _, v := range members {
			w.comp[v] = int32(ci)
			if nodes[v].Module < nodes[start].Module {
				start = v
			}
		}
		path, firstOn, ok := w.shortest(adj, int32(ci), start, members)
		if !ok {
			continue // cannot happen in a component of two or more
		}
		names := make([]string, 0, len(path)+1)
		for _, v := range path {
			names = append(names, nodes[v].Module)
		}
		names = append(names, nodes[start].Module)
		reports = append(reports, report{
			m:     nodes[start],
			field: field("build.on", int(firstOn)),
			msg: fmt.Sprintf("build.on forms a cycle: %s; an image cannot be built FROM an image built FROM it: remove one of these build.on entries",
				strings.Join(names, " → ")),
		})
	}
	sort.Slice(reports, func(i, j int) bool { return reports[i].m.Module < reports[j].m.Module })
	for _, r := range reports {
		c.refuse(r.m, r.field, "%s", r.msg)
	}
}

// onGraph is the build.on graph of the modules that build: its nodes, and
// each one's edges to the modules it is built on (self-edges left out).
func onGraph(first []*Manifest) ([]*Manifest, [][]edge) {
	var nodes []*Manifest
	id := make(map[string]int32)
	for _, m := range first {
		if m.Build != nil {
			id[m.Module] = int32(len(nodes))
			nodes = append(nodes, m)
		}
	}
	adj := make([][]edge, len(nodes))
	for v, m := range nodes {
		for i, on := range m.Build.On {
			if w, ok := id[on]; ok && int(w) != v {
				adj[v] = append(adj[v], edge{to: w, on: int32(i)})
			}
		}
	}
	return nodes, adj
}

// cycleWalk is the state of the breadth-first walks that find each
// component's shortest cycle, kept across components.
type cycleWalk struct {
	comp   []int32 // each node's component, -1 for none
	parent []edge
	seen   []bool
}

func newCycleWalk(n int) *cycleWalk {
	w := &cycleWalk{comp: make([]int32, n), parent: make([]edge, n), seen: make([]bool, n)}
	for i := range w.comp {
		w.comp[i] = -1
	}
	return w
}

// shortest walks breadth first from start, within component ci, until an
// edge leads back to it, and returns the cycle's nodes from start and the
// build.on index of its first edge.
func (w *cycleWalk) shortest(adj [][]edge, ci, start int32, members []int32) (path []int32, firstOn int32, ok bool) {
	queue := []int32{start}
	w.seen[start] = true
	var last int32 = -1
	var lastOn int32
search:
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		for _, e := range adj[u] {
			if w.comp[e.to] != ci {
				continue
			}
			if e.to == start {
				last, lastOn = u, e.on
				break search
			}
			if !w.seen[e.to] {
				w.seen[e.to] = true
				w.parent[e.to] = edge{to: u, on: e.on}
				queue = append(queue, e.to)
			}
		}
	}
	for _, v := range members {
		w.seen[v] = false
	}
	if last < 0 {
		return nil, 0, false
	}
	path = []int32{start}
	firstOn = lastOn
	for v := last; v != start; v = w.parent[v].to {
		path = append(path, v)
		if w.parent[v].to == start {
			firstOn = w.parent[v].on
		}
	}
	slices.Reverse(path[1:])
	return path, firstOn, true
}

// components returns the strongly connected components of two or more
// nodes (Tarjan's algorithm, without recursion so that a deep chain of
// build.on cannot exhaust the stack).
func components(adj [][]edge) [][]int32 {
	n := len(adj)
	index := make([]int32, n) // 0: not yet visited
	low := make([]int32, n)
	onStack := make([]bool, n)
	var (
		stack []int32
		out   [][]int32
		next  int32
	)
	type frame struct {
		v  int32
		ei int
	}
	var calls []frame
	visit := func(v int32) {
		next++
		index[v], low[v] = next, next
		stack = append(stack, v)
		onStack[v] = true
		calls = append(calls, frame{v: v})
	}
	for s := range int32(n) {
		if index[s] != 0 {
			continue
		}
		visit(s)
		for len(calls) > 0 {
			f := &calls[len(calls)-1]
			v := f.v
			if f.ei < len(adj[v]) {
				w := adj[v][f.ei].to
				f.ei++
				if index[w] == 0 {
					visit(w)
				} else if onStack[w] && index[w] < low[v] {
					low[v] = index[w]
				}
				continue
			}
			calls = calls[:len(calls)-1]
			if len(calls) > 0 {
				if u := calls[len(calls)-1].v; low[v] < low[u] {
					low[u] = low[v]
				}
			}
			if low[v] != index[v] {
				continue
			}
			k := len(stack) - 1
			for stack[k] != v {
				k--
			}
			members := stack[k:]
			for _, w := range members {
				onStack[w] = false
			}
			if len(members) > 1 {
				out = append(out, slices.Clone(members))
			}
			stack = stack[:k]
		}
	}
	return out
}
