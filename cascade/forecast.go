package cascade

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// # A plan's critical path and ETA
//
// A running plan ends when the last chain of builds still ahead of it
// ends: its remaining critical path, the chain of modules (each built on
// the one before) with the longest sum of remaining build time. A module
// building has its estimate less the time it has been building left; one
// queued, ready or waiting has its whole estimate (one queued to be
// retried after a delay, the delay too); a module built,
// unchanged, failed, blocked or cancelled has nothing left and holds
// nothing up. The first module of the chain is the one holding the plan
// up now.
//
// With many modules and few machines the machines are the bound instead:
// the plan cannot end before its remaining work, spread over every
// machine, is done. The forecast is the longer of the two (the simulator
// measures the cascade within 1% of that bound, see cascade/sim).
//
// A build rarely takes exactly its estimate: the time a building module
// has left is what a build that has already taken its elapsed time is
// expected to take more, taking build times as lognormal around their
// estimates with the spread the plan's finished builds showed (their
// durations against their estimates). So a module past its estimate still
// has some time left, the more the noisier builds are.
//
// Estimates are each module's last build duration (the controller's
// estimate.<module>, the same that ranks asks); a module with none counts
// the mean of those known. CriticalPath is a pure function of the modules'
// states, the estimates and the time: `builds show` and `builds watch`
// compute it from the stored modules, the controller stores it with each
// plan record and exports it as a metric.

// Bounds: what decides a forecast's remaining time.
const (
	// BoundPath: the remaining critical path.
	BoundPath = "path"
	// BoundMachines: the remaining work over the machines.
	BoundMachines = "machines"
)

// Forecast is a plan's remaining critical path and estimated finish, as of
// At.
type Forecast struct {
	At time.Time `json:"at"`
	// Remaining is how long the plan has left: the longer of PathLeft and
	// Work over Machines.
	Remaining time.Duration `json:"remaining"`
	// Finish is At + Remaining: the estimated end of the plan.
	Finish time.Time `json:"finish"`
	// Bound is what decides Remaining: BoundPath or BoundMachines.
	Bound string `json:"bound"`
	// Path is the remaining critical path, the module holding the plan up
	// first; each is built on the one before.
	Path []PathStep `json:"path"`
	// PathLeft is the remaining time along Path.
	PathLeft time.Duration `json:"path_left"`
	// Work is the remaining build time of every module still to build.
	Work time.Duration `json:"work"`
	// Left is how many modules are still to build.
	Left int `json:"left"`
	// Machines are the machines the work is spread over; 0: not known, the
	// path alone decides.
	Machines int `json:"machines,omitempty"`
	// Guessed is how many modules still to build have no estimate of their
	// own: they count the mean of the known ones.
	Guessed int `json:"guessed,omitempty"`
	// Unknown says that no module of the plan has an estimate: times are
	// unknown, and Path is the longest chain in modules.
	Unknown bool `json:"unknown,omitempty"`
	// Stalled names a module still to build whose ask no machine online
	// can take, and why ("odd-arm: no linux/arm64 machine online"): the
	// plan cannot end until one comes, so Finish is only what it would be
	// if one came now. Empty when every ask left has machines.
	Stalled string `json:"stalled,omitempty"`
}

// PathStep is one module of a remaining critical path.
type PathStep struct {
	Module string      `json:"module"`
	State  ModuleState `json:"state"`
	// Estimate is the module's whole expected build time.
	Estimate time.Duration `json:"estimate"`
	// Left is what remains of it: the estimate, less the time it has been
	// building.
	Left time.Duration `json:"left"`
	// Overdue says that a building module has taken longer than its
	// estimate (Left is then 0).
	Overdue bool `json:"overdue,omitempty"`
	// Guessed says the module has no estimate of its own.
	Guessed bool `json:"guessed,omitempty"`
	// On is the machine building it.
	On string `json:"on,omitempty"`
	// Delay is how long a module handed back to be retried after a delay
	// waits still before its next attempt: part of Left, on top of its
	// estimate.
	Delay time.Duration `json:"delay,omitempty"`
}

// Holding is the module holding the plan up (the first of its critical
// path), if any is left.
func (f Forecast) Holding() (PathStep, bool) {
	if len(f.Path) == 0 {
		return PathStep{}, false
	}
	return f.Path[0], true
}

// String is the forecast in one line, as `builds watch` prints it:
// "waiting on tool-17 (building on host-a1): 4m12s of 6m left on the
// critical path; finish ≈ 14:03:12".
func (f Forecast) String() string {
	h, ok := f.Holding()
	if !ok {
		return "nothing left to build"
	}
	what := string(h.State)
	if h.State == Ready {
		what = string(Waiting) // for a machine, as every summary says
	}
	if h.On != "" {
		what += " on " + h.On
	}
	if h.Delay > 0 {
		what += ", next attempt in " + roundETA(h.Delay)
	}
	if f.Unknown {
		s := fmt.Sprintf("waiting on %s (%s): %d of %d modules left on the critical path; ", h.Module, what, len(f.Path), f.Left)
		if f.Stalled != "" {
			return s + "no finish estimate while " + f.Stalled
		}
		return s + "no build times known yet, no finish estimate"
	}
	s := fmt.Sprintf("waiting on %s (%s): %s of %s left on the critical path", h.Module, what, roundETA(h.Left), roundETA(f.PathLeft))
	if h.Overdue {
		// Its own estimate is spent: what is left of it is a guess, and
		// the path is what to read.
		s = fmt.Sprintf("waiting on %s (%s, past its %s estimate): %s left on the critical path", h.Module, what, roundETA(h.Estimate), roundETA(f.PathLeft))
	}
	if f.Bound == BoundMachines {
		s += fmt.Sprintf("; %s of work on %d machines is longer", roundETA(f.Work), f.Machines)
	}
	if f.Stalled != "" {
		return s + "; no finish estimate while " + f.Stalled
	}
	return s + fmt.Sprintf("; finish ≈ %s (in %s)", f.Finish.Local().Format("15:04:05"), roundETA(f.Remaining))
}

// roundETA rounds an estimate for display: to the second, or the tenth of
// one under ten seconds.
func roundETA(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// left reports whether a module in state st is still to build.
func (st ModuleState) left() bool {
	return st == Waiting || st == Ready || st == Queued || st == Building
}

// Forecast is the plan's forecast at now (see CriticalPath).
func (s *State) Forecast(est map[string]time.Duration, now time.Time, machines int) Forecast {
	if !s.Cancelled.IsZero() {
		return Forecast{At: now, Finish: now, Bound: BoundPath}
	}
	return CriticalPath(s.Modules, est, now, machines)
}

// CriticalPath computes a plan's forecast at now from its modules' states:
// its remaining critical path and, with machines > 0, the bound of its
// remaining work over them. est gives each module's expected build time
// (missing: the module's own ModuleStatus.Estimate; neither: the mean of
// those known). A building module's elapsed time (since Started) is taken
// off its estimate. It does no I/O and changes nothing.
func CriticalPath(mods []ModuleStatus, est map[string]time.Duration, now time.Time, machines int) Forecast {
	f := Forecast{At: now, Finish: now, Bound: BoundPath, Machines: max(machines, 0)}
	estimate, unit, unknown := estimatesOf(mods, est)
	f.Unknown = unknown
	spread := spreadOf(mods, estimate)
	w := newPathWalk(mods, func(i int) PathStep { return stepOf(mods[i], estimate[i], unit, unknown, spread, now) })
	end := -1
	for i, m := range mods {
		if !m.State.left() {
			continue
		}
		f.Left++
		if m.Waiting != "" && f.Stalled == "" {
			f.Stalled = m.Module + " waits: " + m.Waiting
		}
		e := w.visit(i)
		if w.steps[i].Guessed {
			f.Guessed++
		}
		f.Work += w.steps[i].Left
		if end < 0 || e > w.finish[end] || (e == w.finish[end] && m.Module < mods[end].Module) {
			end = i
		}
	}
	if end < 0 {
		return f
	}
	for i := end; i >= 0; i = w.via[i] {
		f.Path = append(f.Path, w.steps[i])
	}
	slices.Reverse(f.Path)
	if f.Unknown {
		f.Work = 0
		return f
	}
	f.PathLeft = w.finish[end]
	f.Remaining = f.PathLeft
	if f.Machines > 0 {
		if spread := f.Work / time.Duration(f.Machines); spread > f.Remaining {
			f.Remaining, f.Bound = spread, BoundMachines
		}
	}
	f.Finish = now.Add(f.Remaining)
	return f
}

// estimatesOf is each module's expected build time (est's, else its own
// Estimate, else 0) and the unit a module without one counts: the mean of
// those known, or, when none is (unknown), one "second" a module, the path
// in modules.
func estimatesOf(mods []ModuleStatus, est map[string]time.Duration) (estimate []time.Duration, unit time.Duration, unknown bool) {
	estimate = make([]time.Duration, len(mods))
	var sum time.Duration
	known := 0
	for i, m := range mods {
		if d, ok := est[m.Module]; ok && d > 0 {
			estimate[i] = d
		} else if m.Estimate > 0 {
			estimate[i] = m.Estimate
		}
		if estimate[i] > 0 {
			sum += estimate[i]
			known++
		}
	}
	if known == 0 {
		return estimate, time.Second, true
	}
	return estimate, sum / time.Duration(known), false
}

// stepOf is module m's step on a path: its estimate (the unit where it has
// none, marked guessed; 0 when no time is known) and what is left of it at
// now (a building module's elapsed time taken off, by the plan's spread).
func stepOf(m ModuleStatus, estimate, unit time.Duration, unknown bool, spread float64, now time.Time) PathStep {
	st := PathStep{Module: m.Module, State: m.State, Estimate: estimate, On: m.On}
	if st.Estimate == 0 {
		st.Estimate, st.Guessed = unit, !unknown
	}
	if unknown {
		st.Estimate = 0
	}
	whole := unit
	if !unknown {
		whole = st.Estimate
	}
	st.Left = whole
	if m.State == Building && !m.Started.IsZero() && !unknown {
		if el := now.Sub(m.Started); el > 0 {
			st.Left = leftOf(whole, el, spread)
			st.Overdue = el > whole
		}
	}
	if m.State != Building {
		st.On = ""
	}
	if hb := m.HandedBack; m.State == Queued && hb != nil && hb.Next.After(now) {
		// Given back to be retried after a delay: nothing starts it
		// before then.
		st.Delay = hb.Next.Sub(now)
		if !unknown {
			st.Left += st.Delay
		}
	}
	return st
}

// pathWalk finds, for each module still to build, when it ends from now
// (finish) if its bases still to build end first, and its base on the
// longest chain to it (via; -1: none left).
type pathWalk struct {
	mods   []ModuleStatus
	pos    map[string]int
	step   func(i int) PathStep
	finish []time.Duration
	via    []int
	steps  []PathStep
}

// pathUnseen marks a module the walk has not reached.
const pathUnseen = -2

func newPathWalk(mods []ModuleStatus, step func(i int) PathStep) *pathWalk {
	w := &pathWalk{mods: mods, pos: make(map[string]int, len(mods)), step: step,
		finish: make([]time.Duration, len(mods)), via: make([]int, len(mods)), steps: make([]PathStep, len(mods))}
	for i, m := range mods {
		w.pos[m.Module] = i
	}
	for i := range w.via {
		w.via[i] = pathUnseen
	}
	return w
}

// visit is when module i ends, from now (0 if it is not still to build).
func (w *pathWalk) visit(i int) time.Duration {
	m := w.mods[i]
	if !m.State.left() {
		return 0
	}
	if w.via[i] != pathUnseen {
		return w.finish[i]
	}
	w.via[i] = -1 // also ends a cycle, which a checked plan has not
	start := time.Duration(0)
	for _, b := range m.Bases {
		j, ok := w.pos[b]
		if !ok {
			continue
		}
		if !w.mods[j].State.left() {
			continue
		}
		// The base that ends last; at a tie the first by name (an
		// overdue base, ending now, still holds its dependents up).
		if e := w.visit(j); w.via[i] < 0 || e > start || (e == start && w.mods[j].Module < w.mods[w.via[i]].Module) {
			start, w.via[i] = e, j
		}
	}
	w.steps[i] = w.step(i)
	w.finish[i] = start + w.steps[i].Left
	return w.finish[i]
}

// defaultSpread is the spread of build times around their estimates
// (σ of ln(duration/estimate)) assumed until a plan has minSpreadSamples
// finished builds to measure it by.
const (
	defaultSpread    = 0.3
	minSpreadSamples = 5
)

// spreadOf measures how far the plan's finished builds were from their
// estimates: the root mean square of ln(duration/estimate).
func spreadOf(mods []ModuleStatus, estimate []time.Duration) float64 {
	var sum float64
	n := 0
	for i, m := range mods {
		if m.State != Built || m.Duration <= 0 || estimate[i] <= 0 {
			continue
		}
		r := math.Log(float64(m.Duration) / float64(estimate[i]))
		sum += r * r
		n++
	}
	if n < minSpreadSamples {
		return defaultSpread
	}
	return max(math.Sqrt(sum/float64(n)), 0.01)
}

// leftOf is the expected time left of a build estimated at est that has
// taken el so far, its time lognormal with median est and spread sigma:
// est·(E[X | X > x] − x), x = el/est.
func leftOf(est, el time.Duration, sigma float64) time.Duration {
	x := float64(el) / float64(est)
	lx := math.Log(x)
	tail := phi(-lx / sigma)
	if tail < 1e-12 {
		// Far past any build like it: as long again as it has taken
		// beyond its estimate is as good a guess as any.
		return el - est
	}
	mean := math.Exp(sigma*sigma/2) * phi((sigma*sigma-lx)/sigma) / tail
	return time.Duration(float64(est) * max(mean-x, 0))
}

// phi is the standard normal distribution function.
func phi(z float64) float64 { return 0.5 * math.Erfc(-z/math.Sqrt2) }
