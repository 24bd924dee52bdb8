package metrics

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// readQueue reads a seat's work queue: its holders' consumers' pending and
// ack pending counts (summed over a seat's consumer per platform) and, if
// asks wait, the age of the oldest one after the last each delivered.
func readQueue(ctx context.Context, js jetstream.JetStream, seat string) (queueState, error) {
	name := mesh.SeatStream(seat)
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return queueState{}, fmt.Errorf("reading stream %s: %w", name, err)
	}
	var st queueState
	found := false
	infos := stream.ListConsumers(ctx)
	for info := range infos.Info() {
		if !strings.HasPrefix(info.Name, mesh.SeatConsumer(seat)) {
			continue
		}
		found = true
		st.depth += info.NumPending
		st.inFlight += info.NumAckPending
		if info.NumPending == 0 {
			continue
		}
		// The next ask this consumer delivers is the first one of its
		// subjects stored after the last it delivered; asked for by
		// subject, so one deleted (cancelled) is skipped over.
		filter := info.Config.FilterSubject
		if filter == "" && len(info.Config.FilterSubjects) > 0 {
			filter = info.Config.FilterSubjects[0]
		}
		if filter == "" {
			filter = mesh.SeatAcceptAll(seat)
		}
		msg, err := stream.GetMsg(ctx, info.Delivered.Stream+1, jetstream.WithGetMsgSubject(filter))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// Delivered in the meantime.
		case err != nil:
			return queueState{}, fmt.Errorf("reading the oldest ask of %s/%s: %w", name, info.Name, err)
		default:
			st.oldest = max(st.oldest, time.Since(msg.Time))
		}
	}
	if err := infos.Err(); err != nil {
		return queueState{}, fmt.Errorf("listing the consumers of %s: %w", name, err)
	}
	if !found {
		return queueState{}, fmt.Errorf("reading %s: no holders' consumer", name)
	}
	return st, nil
}
