package metrics_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
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

	stream, err := js.Stream(ctx, mesh.SeatStream(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	// publish returns the ask's sequence and the time the server stored
	// it, which is what the collector measures an age from.
	publish := func(id string) (uint64, time.Time) {
		ack, err := js.Publish(ctx, mesh.BuildSubject(mesh.DefaultPlatform), []byte(`{"id":"`+id+`"}`), jetstream.WithMsgID(id))
		if err != nil {
			t.Fatal(err)
		}
		m, err := stream.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence, m.Time
	}
	// scrape reads the collector and the ages, at that scrape, an ask
	// stored at each of ats may have: from before it to after it.
	type span struct{ lo, hi float64 }
	scrape := func(ats ...time.Time) (queueReading, []span) {
		before := time.Now()
		r := readCollector(t, reg)
		after := time.Now()
		var spans []span
		for _, at := range ats {
			spans = append(spans, span{before.Sub(at).Seconds() - 0.005, after.Sub(at).Seconds() + 0.005})
		}
		return r, spans
	}
	in := func(v float64, s span) bool { return s.lo <= v && v <= s.hi }
	// An age is what is measured, so the asks must differ in age by more
	// than a scrape takes to tell them apart: each is published once the
	// one before has been stored for gap, by the server's own record. The
	// checks below hold whatever the machine's load; only the ages they
	// compare come from the clock.
	const gap = 500 * time.Millisecond
	storedFor := func(at time.Time) {
		testenv.WaitFor(t, 10*time.Second, "the ask to age", func() bool { return time.Since(at) >= gap })
	}
	_, at1 := publish("ask-1")
	storedFor(at1)
	seq2, at2 := publish("ask-2")
	storedFor(at2)
	_, at3 := publish("ask-3")

	r, ages := scrape(at1, at2, at3)
	if r.up != 1 || r.depth != 3 || r.inFlight != 0 || !in(r.oldest, ages[0]) || in(r.oldest, ages[1]) {
		t.Fatalf("three asks waiting: %+v; want the first's age, in %v (not the second's, %v)", r, ages[0], ages[1])
	}

	// A holder takes the first ask: the second is now the oldest waiting.
	cons, err := js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
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
	r, ages = scrape(at1, at2, at3)
	if r.depth != 2 || r.inFlight != 1 || !in(r.oldest, ages[1]) || in(r.oldest, ages[0]) || in(r.oldest, ages[2]) {
		t.Fatalf("one taken, two waiting: %+v; want the second ask's age, in %v", r, ages[1])
	}

	// The second is cancelled (deleted from the queue): the third is next.
	if err := stream.DeleteMsg(ctx, seq2); err != nil {
		t.Fatal(err)
	}
	r, ages = scrape(at1, at2, at3)
	if r.depth != 1 || r.inFlight != 1 || !in(r.oldest, ages[2]) || in(r.oldest, ages[1]) {
		t.Fatalf("second deleted: %+v; want the third ask's age, in %v", r, ages[2])
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
