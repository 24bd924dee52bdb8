package metrics_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/metrics"
)

// queueReading is one scrape of the queue collector for the build seat.
type queueReading struct {
	up, depth, inFlight, oldest float64
	series                      int
}

func readCollector(t *testing.T, reg *prometheus.Registry) queueReading {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var r queueReading
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "seat" || m.GetLabel()[0].GetValue() != mesh.BuildSeat {
				t.Fatalf("%s: labels %v, want seat=%s", f.GetName(), m.GetLabel(), mesh.BuildSeat)
			}
			r.series++
			v := m.GetGauge().GetValue()
			switch f.GetName() {
			case "meshbuild_queue_up":
				r.up = v
			case "meshbuild_queue_depth":
				r.depth = v
			case "meshbuild_queue_in_flight":
				r.inFlight = v
			case "meshbuild_queue_oldest_ask_age_seconds":
				r.oldest = v
			}
		}
	}
	return r
}

func TestQueueCollectorReadsTheSeatsWorkQueue(t *testing.T) {
	js := raisedQueue(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewQueueCollector(js, []string{mesh.BuildSeat}))
	ctx := testCtx(t)

	if r := readCollector(t, reg); r != (queueReading{up: 1, series: 4}) {
		t.Fatalf("empty queue: %+v, want up and all zero", r)
	}

	publish := func(id string) uint64 {
		ack, err := js.Publish(ctx, mesh.SeatAcceptSubject(mesh.BuildSeat, mesh.BuildVerb), []byte(`{"id":"`+id+`"}`), jetstream.WithMsgID(id))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	publish("ask-1")
	time.Sleep(500 * time.Millisecond)
	seq2 := publish("ask-2")
	time.Sleep(500 * time.Millisecond)
	publish("ask-3")

	r := readCollector(t, reg)
	if r.up != 1 || r.depth != 3 || r.inFlight != 0 || r.oldest < 0.9 || r.oldest > 10 {
		t.Fatalf("three asks waiting, the first for 1s: %+v", r)
	}
	ageOfFirst := r.oldest

	// A holder takes the first ask: the second is now the oldest waiting.
	cons, err := js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.SeatConsumer(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first := <-batch.Messages()
	if first == nil {
		t.Fatal("no ask delivered")
	}
	r = readCollector(t, reg)
	if r.depth != 2 || r.inFlight != 1 || r.oldest > ageOfFirst-0.3 || r.oldest < 0.3 {
		t.Fatalf("one taken, two waiting: %+v; want the second ask's age, about %.1fs", r, ageOfFirst-0.5)
	}
	ageOfSecond := r.oldest

	// The second is cancelled (deleted from the queue): the third is next.
	stream, err := js.Stream(ctx, mesh.SeatStream(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, seq2); err != nil {
		t.Fatal(err)
	}
	r = readCollector(t, reg)
	if r.depth != 1 || r.inFlight != 1 || r.oldest > ageOfSecond-0.3 {
		t.Fatalf("second deleted: %+v; want the third ask's age, under %.1fs", r, ageOfSecond-0.3)
	}

	// Settle everything: nothing waits, nothing is in flight.
	if err := first.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	batch, err = cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if r := readCollector(t, reg); r != (queueReading{up: 1, series: 4}) {
		t.Fatalf("all settled: %+v, want up and all zero", r)
	}
}

func TestQueueCollectorSaysWhenAQueueCannotBeRead(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s) // nothing raised
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewQueueCollector(js, []string{mesh.BuildSeat}))
	if r := readCollector(t, reg); r != (queueReading{up: 0, series: 1}) {
		t.Fatalf("no queue: %+v, want only up 0", r)
	}
	if n, err := testutil.GatherAndCount(reg, "meshbuild_queue_up"); err != nil || n != 1 {
		t.Fatalf("up series %d, %v", n, err)
	}

	// A server that is gone is bounded by the scrape timeout.
	s.Shutdown()
	start := time.Now()
	if r := readCollector(t, reg); r.up != 0 {
		t.Fatalf("server gone: %+v", r)
	}
	if took := time.Since(start); took > metrics.QueueScrapeTimeout+time.Second {
		t.Fatalf("a scrape with the server gone took %s, want at most %s", took, metrics.QueueScrapeTimeout)
	}
}
