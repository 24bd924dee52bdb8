package cascade_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// A controller whose consumer on EVENTS forgot what it had acknowledged
// (kept in memory on a cluster stopped whole, or deleted and made anew by
// the next raise) is delivered the stream again from its start: the
// events at or below the floor it stored are acknowledged without being
// worked. A push whose plan was pruned since is not planned and built a
// second time, and the next push is built as ever.
func TestAControllerWhoseConsumerForgotItsEventsWorksNoneTwice(t *testing.T) {
	h := newHarness(t, map[string][]string{"a": nil, "b": {"a"}}, 1)
	ctx := context.Background()
	st := h.store()
	first := h.push("c1", "push-c1")
	h.settle(first, 30*time.Second)
	second := h.push("c2", "push-c2")
	h.settle(second, 30*time.Second)
	events, err := h.js.Stream(ctx, mesh.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := events.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last := info.State.LastSeq
	testenv.WaitFor(t, 10*time.Second, "the events floor stored through every event", func() bool {
		fl, ok, err := st.Floor(ctx)
		return err == nil && ok && fl.Through >= last && fl.Stream.Equal(info.Created)
	})
	h.stopControllerNow()
	if n, err := st.Prune(ctx, 1); err != nil || n != 1 {
		t.Fatalf("pruning all but the newest plan: %d pruned, %v; want the first pruned", n, err)
	}
	consumer := mesh.ModuleConsumer(h.c.Module())
	if err := h.js.DeleteConsumer(ctx, mesh.EventsStream, consumer); err != nil {
		t.Fatal(err)
	}
	asked := len(h.w.asksOf("a"))
	// The next controller's raise makes the consumer anew: it delivers
	// EVENTS from its start.
	h.startController()
	testenv.WaitFor(t, 20*time.Second, "every event delivered again and acknowledged", func() bool {
		c, err := h.js.Consumer(ctx, mesh.EventsStream, consumer)
		if err != nil {
			return false
		}
		ci, err := c.Info(ctx)
		return err == nil && ci.AckFloor.Stream >= last && ci.NumPending == 0 && ci.NumAckPending == 0
	})
	if _, err := st.Plan(ctx, first); !errors.Is(err, cascade.ErrNoPlan) {
		t.Fatalf("the pruned plan %s after its push was delivered again: %v; want it not planned again", first, err)
	}
	if n := len(h.w.asksOf("a")); n != asked {
		t.Fatalf("a asked %d times after the events were delivered again, want %d", n, asked)
	}
	third := h.push("c3", "push-c3")
	if rec, _ := h.settle(third, 30*time.Second); rec.Outcome != cascade.OutcomeBuilt {
		t.Fatalf("the next push settled %s, want built", rec.Outcome)
	}
}
