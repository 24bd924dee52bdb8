// Package sim is a deterministic discrete-event simulator of a build farm:
// the pure reference for the scheduling benchmarks (the benchmark through
// the real bus lives in package cascade's tests). It is used only by tests,
// benchmarks and cmd/benchtable: it sits beside cascade, whose tests it
// serves (as cascadetest does), and no core package imports it outside its
// tests. It does not import cascade: cascade's own tests run State through
// the same DAGs (SimulateState, in cascade/simstate_test.go) and compare.
//
// M machines pull one ask at a time from one shared queue; a policy decides when asks enter the queue and in which order.
//
// What the benchmarks in sim_test.go show (makespan over the lower bound
// max(critical path, total work / M); 1 is optimal):
//
//		                                     fan 35 on 4       fan 35 on 4      1,000-module DAG
//		                                     equal durations   lognormal σ=1    on 50, lognormal σ=1
//		tier barrier                         1.11              1.22             2.82
//		cascade, FIFO queue                  1.11              1.22             1.08
//		cascade, batches ranked (State)      1.11              1.07             1.08
//		cascade, window 1 (State.Window)     1.11              1.07             1.004
//		list scheduling, longest path first  1.11              1.07             1.000
//
//	  - A fan is one base built alone and then n asks sharing M machines: the
//	    bound ignores the base's turn alone, so 1.11 is the best there is with
//	    equal durations. With lognormal durations, ranking by estimate is the
//	    longest-first rule and gains 15%.
//	  - On the layered DAG the tier barrier loses most: every tier waits for
//	    its slowest image. The cascade with a FIFO queue is within 8% of the
//	    bound; ranking each released batch barely helps, because the queue is
//	    still first-in first-out across batches.
//	  - Holding released asks in the controller and publishing the best one
//	    whenever a holder takes one (a window of 1-5 queued asks per plan)
//	    makes a FIFO work queue behave as a priority queue: within 0.4-2% of
//	    the bound with duration estimates (about 5% with none: estimates are
//	    what make the order good). The cost is one controller round trip
//	    between a holder taking an ask and the next being published, which
//	    the simulator does not charge for.
package sim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

// DAG is a build graph for simulation: node i is built on Bases[i] and
// takes Dur[i] (any unit). Names are unique and, for the policies' tie
// breaks to agree with State's, sort in index order.
type DAG struct {
	Names []string
	Bases [][]int
	Dur   []float64
}

// Len is the number of nodes.
func (d DAG) Len() int { return len(d.Names) }

// Fan is one base with n dependents, every build taking 1.
func Fan(n int) DAG {
	d := DAG{Names: make([]string, n+1), Bases: make([][]int, n+1), Dur: make([]float64, n+1)}
	for i := range d.Names {
		d.Names[i] = simName(i, n+1)
		d.Dur[i] = 1
		if i > 0 {
			d.Bases[i] = []int{0}
		}
	}
	return d
}

// RandomLayeredDAG is n nodes in the given number of layers (n/layers each,
// the remainder in the last). A node of layer k > 0 is built on one node of
// layer k-1 and up to two more of any earlier layer, so its tier is k.
// Durations are lognormal with median 1 (σ = 1: a long tail, as builds
// have). The same arguments give the same DAG.
func RandomLayeredDAG(n, layers int, seed uint64) DAG {
	if layers < 1 {
		layers = 1
	}
	layers = min(layers, max(n, 1))
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	per := n / layers
	d := DAG{Names: make([]string, n), Bases: make([][]int, n), Dur: make([]float64, n)}
	for i := range n {
		d.Names[i] = simName(i, n)
		l := min(i/per, layers-1)
		if l > 0 {
			bases := []int{(l-1)*per + rng.IntN(per)}
			for range rng.IntN(3) {
				if b := rng.IntN(l * per); !slices.Contains(bases, b) {
					bases = append(bases, b)
				}
			}
			slices.Sort(bases)
			d.Bases[i] = bases
		}
		d.Dur[i] = math.Exp(rng.NormFloat64())
	}
	return d
}

// Lognormal returns a copy of d with durations drawn from a lognormal
// distribution with median 1 and the given σ.
func (d DAG) Lognormal(seed uint64, sigma float64) DAG {
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	out := d
	out.Dur = make([]float64, len(d.Dur))
	for i := range out.Dur {
		out.Dur[i] = math.Exp(sigma * rng.NormFloat64())
	}
	return out
}

func simName(i, n int) string {
	w := len(strconv.Itoa(max(n-1, 0)))
	return fmt.Sprintf("m%0*d", w, i)
}

// FromPlan is a plan's graph with the given durations (missing ones are 1).
func FromPlan(p planner.Plan, dur map[string]float64) DAG {
	n := len(p.Modules)
	pos := make(map[string]int, n)
	for i, m := range p.Modules {
		pos[m.Module] = i
	}
	d := DAG{Names: make([]string, n), Bases: make([][]int, n), Dur: make([]float64, n)}
	for i, m := range p.Modules {
		d.Names[i] = m.Module
		for _, b := range m.InPlanBases {
			d.Bases[i] = append(d.Bases[i], pos[b])
		}
		d.Dur[i] = 1
		if v, ok := dur[m.Module]; ok {
			d.Dur[i] = v
		}
	}
	return d
}

// Catalogue is the DAG as a catalogue: one built module per node, from one
// repository, built on its bases.
func (d DAG) Catalogue() *mesh.Catalogue {
	ms := make([]*mesh.Manifest, len(d.Names))
	for i, name := range d.Names {
		on := make([]string, len(d.Bases[i]))
		for k, b := range d.Bases[i] {
			on[k] = d.Names[b]
		}
		ms[i] = &mesh.Manifest{Module: name, Build: &mesh.Build{Repo: "sim", Path: name, On: on}}
	}
	return mesh.NewCatalogue(ms)
}

// Plan plans a push to the DAG's repository: every node.
func (d DAG) Plan() (planner.Plan, error) {
	return planner.New(d.Catalogue(), planner.Trigger{Kind: planner.KindPush, Repo: "sim", Commit: "sim"})
}

func (d DAG) dependents() [][]int {
	deps := make([][]int, len(d.Names))
	for i, bs := range d.Bases {
		for _, b := range bs {
			deps[b] = append(deps[b], i)
		}
	}
	return deps
}

// topo is a topological order, bases first; it panics on a cycle.
func (d DAG) topo() []int {
	deps := d.dependents()
	indeg := make([]int, len(d.Names))
	for i, bs := range d.Bases {
		indeg[i] = len(bs)
	}
	var order []int
	for i := range indeg {
		if indeg[i] == 0 {
			order = append(order, i)
		}
	}
	for k := 0; k < len(order); k++ {
		for _, x := range deps[order[k]] {
			if indeg[x]--; indeg[x] == 0 {
				order = append(order, x)
			}
		}
	}
	if len(order) != len(d.Names) {
		panic("cascade: simulated DAG has a cycle")
	}
	return order
}

// Work is the sum of all durations.
func (d DAG) Work() float64 {
	var w float64
	for _, x := range d.Dur {
		w += x
	}
	return w
}

// CriticalPath is the longest sum of durations along a chain of bases.
func (d DAG) CriticalPath() float64 {
	finish := make([]float64, len(d.Names))
	var cp float64
	for _, i := range d.topo() {
		var start float64
		for _, b := range d.Bases[i] {
			start = max(start, finish[b])
		}
		finish[i] = start + d.Dur[i]
		cp = max(cp, finish[i])
	}
	return cp
}

// LowerBound is max(critical path, total work / machines): no schedule on
// that many machines is shorter.
func LowerBound(d DAG, machines int) float64 {
	return max(d.CriticalPath(), d.Work()/float64(machines))
}

// ranks are remaining critical paths by the given estimates (nil: unit).
func (d DAG) ranks(est []float64) []float64 {
	deps := d.dependents()
	order := d.topo()
	rank := make([]float64, len(d.Names))
	for k := len(order) - 1; k >= 0; k-- {
		i := order[k]
		e := 1.0
		if est != nil {
			e = est[i]
		}
		var longest float64
		for _, x := range deps[i] {
			longest = max(longest, rank[x])
		}
		rank[i] = e + longest
	}
	return rank
}

func tiers(d DAG) []int {
	tier := make([]int, len(d.Names))
	for _, i := range d.topo() {
		for _, b := range d.Bases[i] {
			tier[i] = max(tier[i], tier[b]+1)
		}
	}
	return tier
}

// Order is how asks released together enter the queue.
type Order int

const (
	// FIFO: asks released together are queued in name order; the queue
	// is first in, first out.
	FIFO Order = iota
	// Ranked: asks released together are queued by descending remaining
	// critical path (as State releases them); the queue is first in,
	// first out.
	Ranked
	// Priority: the next idle machine takes the ready ask with the longest
	// remaining critical path, whenever it was released: list scheduling,
	// longest path first. A heuristic, not the optimum (Optimal is exact,
	// for small DAGs): it never leaves a machine idle while an ask is
	// ready, and longest first can pair builds badly.
	Priority
)

func (o Order) String() string {
	switch o {
	case FIFO:
		return "fifo"
	case Ranked:
		return "ranked"
	case Priority:
		return "priority"
	}
	return "order(" + strconv.Itoa(int(o)) + ")"
}

// ControllerAging is the controller's Aging (cascade.Aging, which its
// tests hold equal to this): the weight the simulations of the
// controller's policy give Policy.Aging.
const ControllerAging = 0.5

// Policy is a scheduling policy.
type Policy struct {
	// Barrier starts tier k+1 only when every module of tier k is built
	// (ADR 0162's tiers as a barrier). Otherwise a module is queued when its
	// last base is built (the cascade).
	Barrier bool
	Order   Order
	// Estimates rank asks for Ranked and Priority: nil ranks by the true
	// durations; UnitEstimates ranks by path length in modules (State
	// without estimates).
	Estimates []float64
	// UnitEstimates ranks every module as 1.
	UnitEstimates bool
	// Aging weighs how long a ready ask has waited against its rank, as
	// the controller does (cascade.Aging): the best is the highest rank
	// less Aging × its ready time, in units of rank — with UnitEstimates,
	// of the mean duration of the builds done so far (none done: no
	// aging). For Priority and Window.
	Aging float64
	// Window, when positive, is the most asks in the queue at once (see
	// State.Window): released asks are held by the controller and the one
	// with the longest remaining critical path is published whenever the
	// queue has room. Order is then ignored.
	Window int
}

// Result is a simulated schedule's length against the lower bound.
type Result struct {
	Makespan   float64
	LowerBound float64
	// Start is when each node started, by index.
	Start []float64
}

// Ratio is Makespan / LowerBound (1 is optimal).
func (r Result) Ratio() float64 { return r.Makespan / r.LowerBound }

// Simulate runs the DAG on machines under a policy.
func Simulate(d DAG, machines int, p Policy) Result {
	if machines < 1 {
		panic("cascade: simulate on no machine")
	}
	est := p.Estimates
	switch {
	case p.UnitEstimates:
		est = nil
	case est == nil:
		est = d.Dur
	}
	rank, tier := d.ranks(est), tiers(d)
	r := Result{LowerBound: LowerBound(d, machines)}
	if p.Barrier {
		r.Makespan, r.Start = simulateBarrier(d, machines, p.Order, rank, tier)
	} else {
		r.Makespan, r.Start = simulateCascade(d, machines, p.Order, rank, tier, p.Window, p.Aging, est == nil)
	}
	return r
}

// byRank sorts nodes by descending rank, then tier, then index: State's
// release order.
func byRank(rank []float64, tier []int) func(a, b int) int {
	return func(a, b int) int {
		switch {
		case rank[a] > rank[b]:
			return -1
		case rank[a] < rank[b]:
			return 1
		case tier[a] != tier[b]:
			return tier[a] - tier[b]
		}
		return a - b
	}
}

func simulateCascade(d DAG, machines int, order Order, rank []float64, tier []int, window int, aging float64, unit bool) (float64, []float64) {
	n := len(d.Names)
	start := make([]float64, n)
	deps := d.dependents()
	remaining := make([]int, n)
	var ready readyQueue
	ready.order, ready.rank, ready.tier, ready.window = order, rank, tier, window
	ready.aging, ready.unitRanks = aging, unit
	if window > 0 {
		ready.order = Ranked
	}
	var roots []int
	for i, bs := range d.Bases {
		remaining[i] = len(bs)
		if len(bs) == 0 {
			roots = append(roots, i)
		}
	}
	ready.release(roots)

	var running events
	free, now, done := machines, 0.0, 0
	for {
		for free > 0 && ready.Len() > 0 {
			i := ready.next()
			start[i] = now
			heap.Push(&running, event{at: now + d.Dur[i], node: i})
			free--
		}
		if running.Len() == 0 {
			break
		}
		now = running[0].at
		for running.Len() > 0 && running[0].at == now {
			e := heap.Pop(&running).(event)
			free++
			done++
			ready.now = now
			ready.doneSum += d.Dur[e.node]
			ready.doneN++
			var batch []int
			for _, x := range deps[e.node] {
				if remaining[x]--; remaining[x] == 0 {
					batch = append(batch, x)
				}
			}
			ready.release(batch)
		}
	}
	if done != n {
		panic("cascade: simulation did not finish every node")
	}
	return now, start
}

func simulateBarrier(d DAG, machines int, order Order, rank []float64, tier []int) (float64, []float64) {
	start := make([]float64, len(d.Names))
	var byTier [][]int
	for i, t := range tier {
		for len(byTier) <= t {
			byTier = append(byTier, nil)
		}
		byTier[t] = append(byTier[t], i)
	}
	var now float64
	for _, nodes := range byTier {
		if order != FIFO {
			slices.SortFunc(nodes, byRank(rank, tier))
		}
		// List scheduling from now: each node to the machine free first.
		free := make(machineHeap, machines)
		for k := range free {
			free[k] = freeAt(now)
		}
		end := now
		for _, i := range nodes {
			at := float64(free[0])
			start[i] = at
			free[0] = freeAt(at + d.Dur[i])
			heap.Fix(&free, 0)
			end = max(end, at+d.Dur[i])
		}
		now = end
	}
	return now, start
}

// readyQueue is the shared queue: FIFO of released batches, or a priority
// queue; with a window, a FIFO of at most window asks fed from the asks the
// controller holds, best first.
type readyQueue struct {
	order  Order
	rank   []float64
	tier   []int
	fifo   []int
	head   int
	prio   prioHeap
	window int
	held   prioHeap
	// aging > 0 (Policy.Aging): prio or held is searched for the best by
	// rank less aging × ready time (the items' readyAt) in units of rank:
	// of time when !unitRanks, else of the mean of the doneN durations
	// done so far (doneSum).
	aging     float64
	unitRanks bool
	now       float64
	doneSum   float64
	doneN     int
}

func (q *readyQueue) fill() {
	for len(q.fifo)-q.head < q.window && q.held.Len() > 0 {
		q.fifo = append(q.fifo, q.pop(&q.held))
	}
}

// pop takes the best item of h: the heap's top, or with aging the best by
// aged rank (a search: the key's unit changes as builds end).
func (q *readyQueue) pop(h *prioHeap) int {
	if q.aging <= 0 {
		return heap.Pop(h).(prioItem).node
	}
	unit := 1.0
	if q.unitRanks {
		if q.doneN == 0 {
			unit = math.Inf(1)
		} else {
			unit = q.doneSum / float64(q.doneN)
		}
	}
	key := func(p prioItem) prioItem {
		p.rank -= q.aging * p.readyAt / unit
		return p
	}
	best := 0
	for k := 1; k < len(*h); k++ {
		if key((*h)[k]).before(key((*h)[best])) {
			best = k
		}
	}
	p := (*h)[best]
	(*h)[best] = (*h)[len(*h)-1]
	*h = (*h)[:len(*h)-1]
	return p.node
}

// push adds an item to h: a heap's, or with aging an unordered list's
// (pop searches it).
func (q *readyQueue) push(h *prioHeap, p prioItem) {
	if q.aging <= 0 {
		heap.Push(h, p)
		return
	}
	*h = append(*h, p)
}

func (q *readyQueue) release(batch []int) {
	if q.window > 0 {
		for _, i := range batch {
			q.push(&q.held, prioItem{node: i, rank: q.rank[i], tier: q.tier[i], readyAt: q.now})
		}
		q.fill()
		return
	}
	switch q.order {
	case Priority:
		for _, i := range batch {
			q.push(&q.prio, prioItem{node: i, rank: q.rank[i], tier: q.tier[i], readyAt: q.now})
		}
	case Ranked:
		slices.SortFunc(batch, byRank(q.rank, q.tier))
		q.fifo = append(q.fifo, batch...)
	default:
		slices.Sort(batch)
		q.fifo = append(q.fifo, batch...)
	}
}

func (q *readyQueue) Len() int { return len(q.fifo) - q.head + q.prio.Len() }

func (q *readyQueue) next() int {
	if q.order == Priority && q.window == 0 {
		return q.pop(&q.prio)
	}
	i := q.fifo[q.head]
	q.head++
	q.fill()
	return i
}

type event struct {
	at   float64
	node int
}

// heapOf is a container/heap of T, ordered by T's before.
type heapOf[T interface{ before(T) bool }] []T

func (h heapOf[T]) Len() int           { return len(h) }
func (h heapOf[T]) Less(a, b int) bool { return h[a].before(h[b]) }
func (h heapOf[T]) Swap(a, b int)      { h[a], h[b] = h[b], h[a] }
func (h *heapOf[T]) Push(x any)        { *h = append(*h, x.(T)) }
func (h *heapOf[T]) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// events is a min-heap of completions by time, then node.
type events = heapOf[event]

func (e event) before(o event) bool {
	if e.at != o.at {
		return e.at < o.at
	}
	return e.node < o.node
}

type prioItem struct {
	node    int
	rank    float64
	tier    int
	readyAt float64
}

// prioHeap pops the highest rank, then the lowest tier, then the lowest
// node.
type prioHeap = heapOf[prioItem]

func (p prioItem) before(o prioItem) bool {
	if p.rank != o.rank {
		return p.rank > o.rank
	}
	if p.tier != o.tier {
		return p.tier < o.tier
	}
	return p.node < o.node
}

// freeAt is the time a machine is free; machineHeap pops the earliest.
type freeAt float64

type machineHeap = heapOf[freeAt]

func (f freeAt) before(o freeAt) bool { return f < o }
