package deploy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Observer is told what the controller's store window and a node's applies
// do, for metrics. The controller calls Report and NodeSeen, a node
// Revisions and Applied. Nil means nothing is observed.
type Observer interface {
	// Report is a report settled by the controller: kind, and how
	// (recorded, superseded, heard, held, let-go).
	Report(kind, how string)
	// NodeSeen is the controller's view of a node after anything about it
	// changed: the revision declared to it, the revision it last said it
	// applied, and when it was last heard from (zero: not since the
	// controller started).
	NodeSeen(node string, declared, applied uint64, heard time.Time)
	// Revisions is a node's own view, told on every declaration it sees
	// and after every outcome: the newest revision it was given and the
	// one it has applied.
	Revisions(declared, applied uint64)
	// Applied is a declaration a node settled: outcome (applied, failed,
	// refused) and how long it took.
	Applied(outcome string, took time.Duration)
}

type nopObserver struct{}

func (nopObserver) Report(string, string)                      {}
func (nopObserver) NodeSeen(string, uint64, uint64, time.Time) {}
func (nopObserver) Revisions(uint64, uint64)                   {}
func (nopObserver) Applied(string, time.Duration)              {}

// outcomes are the outcomes of a declaration, pre-initialised to zero so
// a rate over them is a number before the first of each.
var outcomes = []string{Applied, Failed, Refused}

// Metrics is the Prometheus Observer. A controller's registers the fleet's
// series (by node label); a node's registers its own (a node const label).
type Metrics struct {
	// The controller's.
	reports  *prometheus.CounterVec // kind, how
	declared *prometheus.GaugeVec   // node
	applied  *prometheus.GaugeVec   // node
	heard    *prometheus.GaugeVec   // node
	// A node's.
	applies  *prometheus.CounterVec   // outcome
	duration *prometheus.HistogramVec // outcome
	lag      prometheus.Gauge
}

// NewMetrics registers the deploy metrics with reg: a node's own series
// when node names it, the controller's view of the fleet when node is "".
func NewMetrics(reg prometheus.Registerer, node string) *Metrics {
	m := &Metrics{}
	var cs []prometheus.Collector
	if node == "" {
		m.reports = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbuild_node_reports_total",
			Help: "Reports to mesh-controller by kind and how the store window settled them (recorded, superseded, heard, held, let-go).",
		}, []string{"kind", "how"})
		m.declared = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbuild_controller_node_declared_revision",
			Help: "The revision of the newest declaration the controller composed for each node.",
		}, []string{"node"})
		m.applied = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbuild_controller_node_applied_revision",
			Help: "The revision each node last told the controller it applied (report or heartbeat); below the declared revision, the node is behind.",
		}, []string{"node"})
		m.heard = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshbuild_controller_node_heard_timestamp_seconds",
			Help: "When each node was last heard from (heartbeat or report), Unix time; `builds nodes` shows a node not heard for the online window (90s by default) offline.",
		}, []string{"node"})
		cs = append(cs, m.reports, m.declared, m.applied, m.heard)
	} else {
		labels := prometheus.Labels{"node": node}
		m.applies = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbuild_node_applies_total", ConstLabels: labels,
			Help: "Declarations the node settled, by outcome (applied, failed, refused).",
		}, []string{"outcome"})
		m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "meshbuild_node_apply_seconds", ConstLabels: labels,
			Help:    "How long settling a declaration took (pulling, verifying, the apply hook), by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}, []string{"outcome"})
		m.lag = prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshbuild_node_revision_lag", ConstLabels: labels,
			Help: "The newest revision the node was declared less the revision it applied: 0 when it runs what it was given.",
		})
		for _, o := range outcomes {
			m.applies.WithLabelValues(o)
			m.duration.WithLabelValues(o)
		}
		cs = append(cs, m.applies, m.duration, m.lag)
	}
	if reg != nil {
		reg.MustRegister(cs...)
	}
	return m
}

// Report implements Observer.
func (m *Metrics) Report(kind, how string) {
	if m.reports != nil {
		m.reports.WithLabelValues(kind, how).Inc()
	}
}

// NodeSeen implements Observer.
func (m *Metrics) NodeSeen(node string, declared, applied uint64, heard time.Time) {
	if m.declared == nil {
		return
	}
	m.declared.WithLabelValues(node).Set(float64(declared))
	m.applied.WithLabelValues(node).Set(float64(applied))
	if !heard.IsZero() {
		m.heard.WithLabelValues(node).Set(float64(heard.UnixNano()) / 1e9)
	}
}

// Revisions implements Observer.
func (m *Metrics) Revisions(declared, applied uint64) {
	if m.lag == nil {
		return
	}
	lag := 0.0
	if declared > applied {
		lag = float64(declared - applied)
	}
	m.lag.Set(lag)
}

// Applied implements Observer.
func (m *Metrics) Applied(outcome string, took time.Duration) {
	if m.applies == nil {
		return
	}
	m.applies.WithLabelValues(outcome).Inc()
	m.duration.WithLabelValues(outcome).Observe(took.Seconds())
}

// Reports is the counter of reports settled as how, for tests and views
// (the controller's).
func (m *Metrics) Reports(kind, how string) prometheus.Counter {
	return m.reports.WithLabelValues(kind, how)
}

// Applies is the counter of declarations a node settled with outcome (a
// node's).
func (m *Metrics) Applies(outcome string) prometheus.Counter {
	return m.applies.WithLabelValues(outcome)
}

// Lag is a node's revision lag gauge (a node's).
func (m *Metrics) Lag() prometheus.Gauge { return m.lag }

// NodeRevisions are the controller's gauges of node's declared and applied
// revisions (the controller's).
func (m *Metrics) NodeRevisions(node string) (declared, applied prometheus.Gauge) {
	return m.declared.WithLabelValues(node), m.applied.WithLabelValues(node)
}
