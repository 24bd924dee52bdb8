package cascade_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/seat"
)

// A controller whose seat claim says it is no longer held (claim.Lease.Held:
// by its own clock, a lease passed without a renewal — a process stopped
// by hand that wakes with its work runnable before its renewals) writes
// nothing more: the built that arrives then is neither stored nor
// acknowledged, and its dependent's ask is not published. The controller
// that holds the seat next finds the event and finishes the plan, each
// module built once.
func TestAControllerThatNoLongerHoldsItsSeatWritesNothing(t *testing.T) {
	s := natstest.Server(t, nil)
	nc, js := natstest.Connect(t, s)
	h := &harness{t: t, s: s, nc: nc, js: js, cat: meshtest.Catalogue(t, map[string][]string{"a": nil, "b": {"a"}, "c": {"b"}}), w: newWork()}
	h.w.sleep["b"] = 1500 * time.Millisecond
	var lost atomic.Bool
	h.held = func() error {
		if lost.Load() {
			return fmt.Errorf("%w: no renewal within the lease (by this process's clock)", claim.ErrLost)
		}
		return nil
	}
	h.startController()
	h.startAgent("m1")
	plan := h.push("c1", "push-c1")
	ctx := context.Background()
	st := h.store()
	testenv.WaitFor(t, 10*time.Second, "b building", func() bool { return len(h.w.asksOf("b")) == 1 })
	lost.Store(true)
	// From here the plan store takes no write of this controller's.
	kv, err := seat.OpenBucket(ctx, js, h.c.Module(), cascade.StateBucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	testenv.WaitFor(t, 10*time.Second, "b's built announced", func() bool { return builtEvents(t, js, "b") == 1 })
	deadline := time.After(2 * time.Second)
	for done := false; !done; {
		select {
		case e := <-w.Updates():
			if e != nil {
				t.Fatalf("the plan store took a write after the seat was lost: %s", e.Key())
			}
		case <-deadline:
			done = true
		}
	}
	if n := len(h.w.asksOf("c")); n != 0 {
		t.Fatalf("c was asked for %d times after the seat was lost", n)
	}
	mods, err := st.Modules(ctx, plan)
	if err != nil {
		t.Fatal(err)
	}
	if mods["b"].State == cascade.Built || mods["c"].State != cascade.Waiting && mods["c"].State != "" {
		t.Fatalf("after the seat was lost: b %s, c %s stored; want b not built, c waiting", mods["b"].State, mods["c"].State)
	}
	// The next holder.
	h.stopControllerNow()
	h.held = nil
	h.startController()
	rec, mods := h.settle(plan, 20*time.Second)
	if rec.Outcome != cascade.OutcomeBuilt {
		t.Fatalf("plan %s after the next holder took over: %+v", rec.Outcome, rec.Counts)
	}
	for _, m := range []string{"a", "b", "c"} {
		if n := len(h.w.asksOf(m)); n != 1 {
			t.Errorf("%s built %d times, want once", m, n)
		}
		if mods[m].State != cascade.Built {
			t.Errorf("%s %s", m, mods[m].State)
		}
	}
}

// A controller killed with events in hand (delivered, not acknowledged: kill
// -9, a machine gone, or a process stopped with SIGSTOP whose seat the
// standby took) left them to its consumer's ack wait, 30 s: a push in its
// hand was planned by the next holder half a minute late. The next holder
// takes them back as it starts consuming (seat.Consume): the plan is made
// and built within seconds, each module once.
func TestTheNextControllerWorksTheEventsAKilledOneHadInHandAtOnce(t *testing.T) {
	h := newHarness(t, map[string][]string{"a": nil, "b": {"a"}, "c": {"b"}}, 1)
	h.stopControllerNow()
	plan := h.push("c1", "push-c1")
	// The killed controller, on its own connection: it was delivered the
	// push and was killed before it acknowledged it.
	ctx := context.Background()
	knc, kjs := natstest.Connect(t, h.s)
	cons, err := kjs.Consumer(ctx, mesh.EventsStream, mesh.ModuleConsumer(h.c.Module()))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	inHand := 0
	for range batch.Messages() {
		inHand++
	}
	knc.Close()
	ours, err := h.js.Consumer(ctx, mesh.EventsStream, mesh.ModuleConsumer(h.c.Module()))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := ours.Info(ctx); err != nil || inHand != 1 || info.NumAckPending != 1 {
		t.Fatalf("the killed controller had %d events in hand, the consumer %+v (%v); want the push", inHand, info, err)
	}

	start := time.Now()
	h.startController()
	rec, mods := h.settle(plan, 15*time.Second)
	t.Logf("the plan settled %s after the next controller started", time.Since(start).Round(time.Millisecond))
	if rec.Outcome != cascade.OutcomeBuilt {
		t.Fatalf("plan %s: %+v", rec.Outcome, rec.Counts)
	}
	for _, m := range []string{"a", "b", "c"} {
		if n := len(h.w.asksOf(m)); n != 1 || mods[m].State != cascade.Built {
			t.Errorf("%s asked for %d times, %s; want once, built", m, n, mods[m].State)
		}
	}
}
