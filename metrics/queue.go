package metrics

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbuild/meshbuild/mesh"
)

// QueueScrapeTimeout bounds how long one scrape reads the work queues.
const QueueScrapeTimeout = 2 * time.Second

// queueCollector reads the seats' work queues on every scrape.
type queueCollector struct {
	js      jetstream.JetStream
	seats   []string
	timeout time.Duration

	up, depth, inFlight, oldest *prometheus.Desc
}

// NewQueueCollector returns a collector that, on every scrape, reads the
// work queue of each seat — its stream and its holders' shared consumer —
// within QueueScrapeTimeout. The connection behind js needs the JetStream
// API grants of the stream and consumer (the controller's have them).
func NewQueueCollector(js jetstream.JetStream, seats []string) prometheus.Collector {
	seat := []string{"seat"}
	return &queueCollector{
		js: js, seats: append([]string(nil), seats...), timeout: QueueScrapeTimeout,
		up: prometheus.NewDesc("meshbuild_queue_up",
			"1 if the seat's work queue could be read at this scrape, 0 if not (the other queue series are then missing).", seat, nil),
		depth: prometheus.NewDesc("meshbuild_queue_depth",
			"Asks waiting in the seat's work queue, not yet delivered to any holder.", seat, nil),
		inFlight: prometheus.NewDesc("meshbuild_queue_in_flight",
			"Asks delivered to a holder of the seat and not yet settled.", seat, nil),
		oldest: prometheus.NewDesc("meshbuild_queue_oldest_ask_age_seconds",
			"Age of the oldest ask waiting in the seat's work queue; 0 when none waits.", seat, nil),
	}
}

// Describe implements prometheus.Collector.
func (q *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- q.up
	ch <- q.depth
	ch <- q.inFlight
	ch <- q.oldest
}

// Collect implements prometheus.Collector.
func (q *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
	defer cancel()
	for _, seat := range q.seats {
		st, err := readQueue(ctx, q.js, seat)
		if err != nil {
			ch <- prometheus.MustNewConstMetric(q.up, prometheus.GaugeValue, 0, seat)
			continue
		}
		ch <- prometheus.MustNewConstMetric(q.up, prometheus.GaugeValue, 1, seat)
		ch <- prometheus.MustNewConstMetric(q.depth, prometheus.GaugeValue, float64(st.depth), seat)
		ch <- prometheus.MustNewConstMetric(q.inFlight, prometheus.GaugeValue, float64(st.inFlight), seat)
		ch <- prometheus.MustNewConstMetric(q.oldest, prometheus.GaugeValue, st.oldest.Seconds(), seat)
	}
}

// queueState is one reading of a seat's work queue.
type queueState struct {
	depth    uint64
	inFlight int
	oldest   time.Duration
}

// readQueue reads a seat's work queue: the consumer's pending and ack
// pending counts and, if asks wait, the age of the first one after the
// last delivered.
func readQueue(ctx context.Context, js jetstream.JetStream, seat string) (queueState, error) {
	name, consumer := mesh.SeatStream(seat), mesh.SeatConsumer(seat)
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return queueState{}, fmt.Errorf("reading stream %s: %w", name, err)
	}
	cons, err := stream.Consumer(ctx, consumer)
	if err != nil {
		return queueState{}, fmt.Errorf("reading consumer %s/%s: %w", name, consumer, err)
	}
	info := cons.CachedInfo()
	st := queueState{depth: info.NumPending, inFlight: info.NumAckPending}
	if info.NumPending == 0 {
		return st, nil
	}
	// The next ask to be delivered is the first one stored after the last
	// delivered; asked for by subject, so one deleted (cancelled) is
	// skipped over.
	msg, err := stream.GetMsg(ctx, info.Delivered.Stream+1, jetstream.WithGetMsgSubject(mesh.SeatAcceptAll(seat)))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Delivered in the meantime.
	case err != nil:
		return queueState{}, fmt.Errorf("reading the oldest ask of %s: %w", name, err)
	default:
		st.oldest = max(0, time.Since(msg.Time))
	}
	return st, nil
}
