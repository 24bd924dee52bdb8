package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbuild/meshbuild/cascade"
)

// Plan outcomes and states pre-initialised (cascade.Outcome* values).
var (
	planStates   = []string{"running", "failed"}
	planOutcomes = []string{"built", "failed", "cancelled"}
)

// Controller records the controller's plans. It implements
// cascade.Observer.
type Controller struct {
	plans    *prometheus.GaugeVec     // state
	settled  *prometheus.CounterVec   // outcome
	duration *prometheus.HistogramVec // outcome
	blocked  prometheus.Gauge
	// unserved counts asks waiting for a platform no machine online builds.
	unserved *prometheus.GaugeVec // platform
	// remaining is each running plan's estimated remaining time.
	remaining *prometheus.GaugeVec // plan
	// refused counts the outcomes the controller refused, by reason.
	refused *prometheus.CounterVec // reason
	// dispatch is how long modules waited from ready to started.
	dispatch *prometheus.HistogramVec // priority, owner
	// modules counts the held plans' modules by state.
	modules *prometheus.GaugeVec // state

	mu       sync.Mutex
	seen     map[string]bool // states ever reported, set to 0 when they go
	seenPlat map[string]bool // platforms ever reported unserved
	running  map[string]bool // plans with a remaining-time series
}

// NewController registers the controller's metrics with reg and returns
// their observer; the common states and outcomes are set to zero at once.
// It panics if reg holds them already.
func NewController(reg prometheus.Registerer) *Controller {
	c := &Controller{
		plans: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbuild_controller_plans",
			Help: "Plans the controller holds, by state: running (modules still to build) or failed (kept for a retry).",
		}, []string{"state"}),
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbuild_controller_plans_settled_total",
			Help: "Plans that settled, by outcome (built, failed, cancelled).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "meshbuild_controller_plan_duration_seconds",
			Help:    "How long a plan took from its trigger until it settled, by outcome.",
			Buckets: planBuckets,
		}, []string{"outcome"}),
		blocked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshbuild_controller_modules_blocked",
			Help: "Modules of the plans held that are blocked: a module they are built on failed.",
		}),
		unserved: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbuild_controller_asks_without_machine",
			Help: "Asks queued for a platform that no online build machine builds, by platform: they wait until a machine of it arrives.",
		}, []string{"platform"}),
		remaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbuild_controller_plan_remaining_seconds",
			Help: "Each running plan's estimated remaining time: the longer of its remaining critical path (modules' last build times, less what the building ones have done) and its remaining work over the machines. The series goes when the plan settles.",
		}, []string{"plan"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbuild_controller_refused_events_total",
			Help: "Outcomes of the build seat the controller refused and that changed nothing, by reason: not from the machine that holds the ask (unclaimed, speaker, attempt, stale, outcome), a built digest the registry does not hold (unresolved, not-image), unreadable (malformed).",
		}, []string{"reason"}),
		dispatch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "meshbuild_controller_ready_to_started_seconds",
			Help:    "How long a module waited from ready (every base built) to started on a machine, by its plan's priority and owner (the trigger's repository unless it named one): the wait the scheduler gives each.",
			Buckets: dispatchBuckets,
		}, []string{"priority", "owner"}),
		modules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbuild_controller_modules",
			Help: "Modules of the plans the controller holds, by state: waiting, ready, queued, building, built, unchanged (its inputs were built before: not dispatched), superseded (a newer plan of its branch builds it), failed, blocked, cancelling, cancelled.",
		}, []string{"state"}),
		seen: map[string]bool{}, seenPlat: map[string]bool{}, running: map[string]bool{},
	}
	reg.MustRegister(c.plans, c.settled, c.duration, c.blocked, c.unserved, c.remaining, c.refused, c.dispatch, c.modules)
	for _, r := range cascade.RefusedReasons {
		c.refused.WithLabelValues(r)
	}
	for _, s := range planStates {
		c.plans.WithLabelValues(s)
		c.seen[s] = true
	}
	for _, o := range planOutcomes {
		c.settled.WithLabelValues(o)
		c.duration.WithLabelValues(o)
	}
	return c
}

// Modules sets the held plans' modules by state (cascade.ModulesObserver).
func (c *Controller) Modules(byState map[string]int) {
	for state, n := range byState {
		c.modules.WithLabelValues(state).Set(float64(n))
	}
}

// RefusedEvent counts an outcome the controller refused
// (cascade.RefusedObserver).
func (c *Controller) RefusedEvent(reason string) { c.refused.WithLabelValues(reason).Inc() }

// PlanSettled records a plan that settled.
func (c *Controller) PlanSettled(outcome string, d time.Duration) {
	c.settled.WithLabelValues(outcome).Inc()
	c.duration.WithLabelValues(outcome).Observe(d.Seconds())
}

// Plans records how many plans the controller holds in each state, and how
// many of their modules are blocked. A state missing from byOutcome is 0.
func (c *Controller) Plans(byOutcome map[string]int, blocked int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.seen {
		if _, ok := byOutcome[s]; !ok {
			c.plans.WithLabelValues(s).Set(0)
		}
	}
	for s, n := range byOutcome {
		c.plans.WithLabelValues(s).Set(float64(n))
		c.seen[s] = true
	}
	c.blocked.Set(float64(blocked))
}

// AsksWithoutMachine records the asks waiting for a platform no online
// machine builds (cascade.PlatformObserver). A platform missing is 0.
func (c *Controller) AsksWithoutMachine(byPlatform map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.seenPlat {
		if _, ok := byPlatform[p]; !ok {
			c.unserved.WithLabelValues(p).Set(0)
		}
	}
	for p, n := range byPlatform {
		c.unserved.WithLabelValues(p).Set(float64(n))
		c.seenPlat[p] = true
	}
}

// dispatchBuckets span a machine idle when the module is ready
// (milliseconds) to a plan of low priority waiting behind others (an hour).
var dispatchBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// Dispatched records how long a module waited from ready to started
// (cascade.SchedulingObserver).
func (c *Controller) Dispatched(priority int, owner string, wait time.Duration) {
	c.dispatch.WithLabelValues(strconv.Itoa(priority), owner).Observe(wait.Seconds())
}

// PlansRemaining records each running plan's estimated remaining time
// (cascade.ForecastObserver); the series of a plan missing (settled) is
// removed.
func (c *Controller) PlansRemaining(byPlan map[string]time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.running {
		if _, ok := byPlan[p]; !ok {
			c.remaining.DeleteLabelValues(p)
			delete(c.running, p)
		}
	}
	for p, d := range byPlan {
		c.remaining.WithLabelValues(p).Set(d.Seconds())
		c.running[p] = true
	}
}
