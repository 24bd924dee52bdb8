package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/mesh"
)

// reasons are the failure classes pre-initialised for failed builds.
var reasons = []string{mesh.ReasonAsk, mesh.ReasonSource, mesh.ReasonBuild, mesh.ReasonPush, mesh.ReasonInfra, mesh.ReasonCancel}

// Buckets of the histograms, in seconds.
var (
	// buildBuckets span a cached no-op build (half a second) to an hour.
	buildBuckets = []float64{0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600}
	// idleBuckets span an ask waiting in the queue (milliseconds) to an
	// idle machine (minutes).
	idleBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}
	// planBuckets span a one-module plan to a whole mesh rebuilt.
	planBuckets = []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400}
)

// Agent records one build agent's work. It implements agent.Observer; every
// series carries the agent's machine as a constant label, so the agents of
// several machines may share one registry.
type Agent struct {
	builds    *prometheus.CounterVec   // outcome, reason
	duration  *prometheus.HistogramVec // outcome
	inFlight  prometheus.Gauge
	healthy   prometheus.Gauge
	idle      prometheus.Histogram
	pushed    prometheus.Counter
	cacheHits prometheus.Counter
}

// NewAgent registers the metrics of the agent on machine with reg and
// returns their observer. The common outcome and reason combinations are
// set to zero at once, so every series exists before the first build. Like
// prometheus.MustRegister, it panics if reg holds them already (the same
// machine twice).
func NewAgent(reg prometheus.Registerer, machine string) *Agent {
	machineLabel := prometheus.Labels{"machine": machine}
	a := &Agent{
		builds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "meshbuild_agent_builds_total",
			Help:        "Asks an agent finished, by outcome (built, failed, retried, handed-back, already-done) and failure reason (source, build, push, infra, ask, cancelled; empty unless failed or retried).",
			ConstLabels: machineLabel,
		}, []string{"outcome", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:        "meshbuild_agent_build_duration_seconds",
			Help:        "How long an agent worked on an ask (checkout, build, push), by outcome.",
			ConstLabels: machineLabel,
			Buckets:     buildBuckets,
		}, []string{"outcome"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "meshbuild_agent_asks_in_flight",
			Help:        "Asks an agent is working on now (at most its slots).",
			ConstLabels: machineLabel,
		}),
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "meshbuild_agent_healthy",
			Help:        "1 while an agent's machine can build, 0 while its BuildKit does not answer (it takes no asks then; builds machines says why).",
			ConstLabels: machineLabel,
		}),
		idle: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "meshbuild_agent_idle_wait_seconds",
			Help:        "How long an idle slot of an agent waited for its next ask.",
			ConstLabels: machineLabel,
			Buckets:     idleBuckets,
		}),
		pushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "meshbuild_agent_pushed_bytes_total",
			Help:        "Bytes of image an agent pushed to the registry.",
			ConstLabels: machineLabel,
		}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "meshbuild_agent_cache_hits_total",
			Help:        "Build steps an agent found in the build cache.",
			ConstLabels: machineLabel,
		}),
	}
	reg.MustRegister(a.builds, a.duration, a.inFlight, a.healthy, a.idle, a.pushed, a.cacheHits)
	a.healthy.Set(1)

	a.builds.WithLabelValues(string(agent.OutcomeBuilt), "")
	a.builds.WithLabelValues(string(agent.OutcomeHandedBack), "")
	a.builds.WithLabelValues(string(agent.OutcomeDone), "")
	a.builds.WithLabelValues(string(agent.OutcomeRetried), mesh.ReasonInfra)
	for _, r := range reasons {
		a.builds.WithLabelValues(string(agent.OutcomeFailed), r)
	}
	for _, o := range agent.Outcomes {
		a.duration.WithLabelValues(string(o))
	}
	return a
}

// Healthy records whether the machine can build (agent.HealthObserver).
func (a *Agent) Healthy(ok bool) {
	if ok {
		a.healthy.Set(1)
	} else {
		a.healthy.Set(0)
	}
}

// IdleWaited records how long an idle slot waited for an ask.
func (a *Agent) IdleWaited(d time.Duration) { a.idle.Observe(d.Seconds()) }

// Began records that a slot began to work on an ask.
func (a *Agent) Began() { a.inFlight.Inc() }

// Ended records how an ask ended. An ask refused before it began — one the
// agent could not read: failed, reason ask, no duration — was never in
// flight and took no build time; it is only counted.
func (a *Agent) Ended(e agent.End) {
	a.builds.WithLabelValues(string(e.Outcome), e.Reason).Inc()
	a.inFlight.Dec()
	if e.Took > 0 { // an ask refused before any work has no build duration
		a.duration.WithLabelValues(string(e.Outcome)).Observe(e.Took.Seconds())
	}
	if e.Bytes > 0 {
		a.pushed.Add(float64(e.Bytes))
	}
	if e.CacheHits > 0 {
		a.cacheHits.Add(float64(e.CacheHits))
	}
}
