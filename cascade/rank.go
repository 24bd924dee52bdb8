package cascade

import (
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// index is derived from the exported fields: rebuilt on load.
type index struct {
	pos       map[string]int
	deps      [][]int // in-plan dependents
	bases     [][]int
	topo      []int // a topological order (bases first)
	remaining []int // in-plan bases not built
	rank      []float64
	// census is how many modules are in each state, kept by set: Counts,
	// Outcome and Fill read it instead of walking every module (the
	// controller asks them on every event and flush of a plan of
	// thousands).
	census map[ModuleState]int
	// tiers is the plan's number of tiers; multi whether any module is
	// built for several platforms (Unindexed has nothing to find
	// otherwise).
	tiers int
	multi bool
	// meanEst is the mean of the known estimates in seconds, 1 when none
	// is known (MeanEstimate).
	meanEst float64
	// rankSeconds: rank is in seconds of estimate (some estimate is
	// known), else in modules. doneSum and doneN are the seconds and the
	// number of the plan's builds done: a module's mean (ageUnit).
	rankSeconds bool
	doneSum     float64
	doneN       int
}

func (s *State) ensure() {
	if s.ix == nil {
		ix, _ := buildIndex(s.Modules)
		s.ix = ix
	}
}

// buildIndex indexes modules; the error reports an inconsistency (the index
// is still usable: unknown bases are ignored, a cycle's modules are
// appended to the order).
func buildIndex(ms []ModuleStatus) (*index, error) {
	var errs []error
	n := len(ms)
	ix := &index{pos: make(map[string]int, n), deps: make([][]int, n), bases: make([][]int, n),
		remaining: make([]int, n), rank: make([]float64, n), census: map[ModuleState]int{}}
	for _, m := range ms {
		ix.census[m.State]++
		ix.tiers = max(ix.tiers, m.Tier+1)
		ix.multi = ix.multi || len(platformsOf(m)) > 1
	}
	for i, m := range ms {
		if _, dup := ix.pos[m.Module]; dup {
			errs = append(errs, fmt.Errorf("module %q listed twice", m.Module))
			continue
		}
		ix.pos[m.Module] = i
	}
	for i, m := range ms {
		for _, b := range m.Bases {
			j, ok := ix.pos[b]
			if !ok {
				errs = append(errs, fmt.Errorf("module %q: base %q is not in the plan", m.Module, b))
				continue
			}
			ix.bases[i] = append(ix.bases[i], j)
			ix.deps[j] = append(ix.deps[j], i)
			if !ms[j].State.done() {
				ix.remaining[i]++
			}
		}
	}
	order, cyclic := mesh.Topo(n, func(i int) iter.Seq[int] { return mesh.Indices(ix.bases[i]) },
		func(i int) iter.Seq[int] { return mesh.Indices(ix.deps[i]) })
	ix.topo = order
	if len(cyclic) > 0 {
		errs = append(errs, errors.New("bases form a cycle"))
		ix.topo = append(ix.topo, cyclic...)
	}
	ix.computeRanks(ms)
	for _, m := range ms {
		if m.State == Built {
			ix.built(m.Duration)
		}
	}
	if len(errs) > 0 {
		return ix, fmt.Errorf("%w: %w", ErrBadState, errors.Join(errs...))
	}
	return ix, nil
}

// computeRanks sets each module's remaining critical path: its estimate plus
// the longest remaining critical path of its dependents. A module without an
// estimate counts the mean of the known estimates, or 1 when none is known.
func (ix *index) computeRanks(ms []ModuleStatus) {
	var sum float64
	var known int
	for _, m := range ms {
		if m.Estimate > 0 {
			sum += m.Estimate.Seconds()
			known++
		}
	}
	def := 1.0
	if known > 0 {
		def = sum / float64(known)
	}
	ix.meanEst, ix.rankSeconds = def, known > 0
	for k := len(ix.topo) - 1; k >= 0; k-- {
		i := ix.topo[k]
		est := def
		if e := ms[i].Estimate; e > 0 {
			est = e.Seconds()
		}
		longest := 0.0
		for _, d := range ix.deps[i] {
			longest = max(longest, ix.rank[d])
		}
		ix.rank[i] = est + longest
	}
}

// SetEstimates sets the expected build durations that order asks (see the
// package doc); modules not in est keep theirs. Typically the durations of
// the modules' last builds.
func (s *State) SetEstimates(est map[string]time.Duration) {
	s.ensure()
	for i := range s.Modules {
		if d, ok := est[s.Modules[i].Module]; ok {
			s.Modules[i].Estimate = d
		}
	}
	s.ix.computeRanks(s.Modules)
}

// Rank is a module's remaining critical path in seconds of estimate (or in
// modules, without estimates): the order asks are released in.
func (s *State) Rank(module string) (float64, bool) {
	s.ensure()
	i, ok := s.ix.pos[module]
	if !ok {
		return 0, false
	}
	return s.ix.rank[i], true
}

// MeanEstimate is how long one of the plan's builds is expected to take,
// in seconds: the mean of its modules' estimates, 1 when none is known.
// The scheduler charges it to the plan's owner for each machine it gives.
func (s *State) MeanEstimate() float64 {
	s.ensure()
	return s.ix.meanEst
}

// Aging weighs how long a ready module has waited against its rank: the
// next ask is the module with the highest remaining critical path less
// Aging × its ready time (from the plan's start), in units of rank —
// seconds when the plan knows estimates; at first sight, when the rank
// counts modules, the mean duration of the plan's builds done so far (none
// done: no aging). At first sight a module's duration is a guess, and one
// of the heavy tail (25 times the median, say) ranked low for its short
// path would wait behind every longer path until the end: in
// cascade/sim, the 1,000-module DAG of BenchmarkControllerDAG1000On50
// (seed 1) ends at 1.151 of list scheduling with the true durations
// without aging, 1.019 with it (ten seeds: 1.047, 1.041; 25 DAGs of other
// shapes: 1.106, 1.105; with learned estimates no change, 1.000). Ranks
// known in seconds move by half a second for each second waited; modules
// released together keep the order of their ranks.
const Aging = 0.5

// built counts a build of d done (ageUnit).
func (ix *index) built(d time.Duration) {
	if d > 0 {
		ix.doneSum += d.Seconds()
		ix.doneN++
	}
}

// ageUnit is the seconds one unit of rank stands for (Aging): 1 when
// ranks are seconds of estimate, else the mean of the plan's builds done;
// 0 when none is done.
func (ix *index) ageUnit() float64 {
	switch {
	case ix.rankSeconds:
		return 1
	case ix.doneN == 0:
		return 0
	}
	return ix.doneSum / float64(ix.doneN)
}

// aged is module i's rank less Aging × its ready time (Aging).
func (s *State) aged(i int, unit float64) float64 {
	r := s.ix.rank[i]
	if ready := s.Modules[i].ReadyAt; unit > 0 && ready.After(s.Created) {
		r -= Aging * ready.Sub(s.Created).Seconds() / unit
	}
	return r
}

// order is the release policy: descending remaining critical path less
// the time waited (Aging), then tier, then name.
func (s *State) order(ms []int) { slices.SortFunc(ms, s.compare) }

// compare orders two modules by the release policy.
func (s *State) compare(a, b int) int {
	u := s.ix.ageUnit()
	ra, rb := s.aged(a, u), s.aged(b, u)
	switch {
	case ra > rb:
		return -1
	case ra < rb:
		return 1
	case s.Modules[a].Tier != s.Modules[b].Tier:
		return s.Modules[a].Tier - s.Modules[b].Tier
	}
	return strings.Compare(s.Modules[a].Module, s.Modules[b].Module)
}
