package deploy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Observer is told what the controller's store window and a node's applies
// do, for metrics. Nil means nothing is observed.
type Observer interface {
	// Report is a report settled by the controller: kind, and how
	// (recorded, superseded, heard, held, let-go).
	Report(kind, how string)
	// Applied is a declaration a node settled: outcome (applied, failed,
	// refused), how long it took, and how many revisions the node is
	// behind once it settled.
	Applied(outcome string, took time.Duration, lag uint64)
}

type nopObserver struct{}

func (nopObserver) Report(string, string)                 {}
func (nopObserver) Applied(string, time.Duration, uint64) {}

// Metrics is the Prometheus Observer.
type Metrics struct {
	reports  *prometheus.CounterVec
	applies  *prometheus.CounterVec
	duration *prometheus.HistogramVec
	lag      prometheus.Gauge
}

// NewMetrics registers the deploy metrics with reg; node labels the node's
// own series ("" on the controller).
func NewMetrics(reg prometheus.Registerer, node string) *Metrics {
	labels := prometheus.Labels{}
	if node != "" {
		labels["node"] = node
	}
	m := &Metrics{
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbuild_node_reports_total", ConstLabels: labels,
			Help: "Reports to mesh-controller by kind and how the store window settled them (recorded, superseded, heard, held, let-go).",
		}, []string{"kind", "how"}),
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshbuild_node_applies_total", ConstLabels: labels,
			Help: "Declarations a node settled, by outcome (applied, failed, refused).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "meshbuild_node_apply_seconds", ConstLabels: labels,
			Help:    "How long applying a declaration took, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}, []string{"outcome"}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshbuild_node_revision_lag", ConstLabels: labels,
			Help: "Revisions the node's applied declaration is behind the newest it was given.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.reports, m.applies, m.duration, m.lag)
	}
	return m
}

// Report implements Observer.
func (m *Metrics) Report(kind, how string) { m.reports.WithLabelValues(kind, how).Inc() }

// Applied implements Observer.
func (m *Metrics) Applied(outcome string, took time.Duration, lag uint64) {
	m.applies.WithLabelValues(outcome).Inc()
	m.duration.WithLabelValues(outcome).Observe(took.Seconds())
	m.lag.Set(float64(lag))
}

// Reports is the counter of reports settled as how, for tests and views.
func (m *Metrics) Reports(kind, how string) prometheus.Counter {
	return m.reports.WithLabelValues(kind, how)
}

// Applies is the counter of declarations a node settled with outcome.
func (m *Metrics) Applies(outcome string) prometheus.Counter {
	return m.applies.WithLabelValues(outcome)
}
