package cascade

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// The hand-out to idle holders waits for the events the server had for
// the controller when it looked: one stored and not delivered, or
// delivered and not worked, holds it; worked, it goes; held for an idle
// look, it goes anyway. (The race it closes: a holder announces built,
// then pulls; the pull, seen first, was handed a busy plan's ask while the
// built made an urgent plan's next module ready.)
func TestAHandOutWaitsForTheEventsBeforeIt(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	const module = "mesh-controller"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: mesh.EventsStream, Subjects: []string{"caughtup.>"}}); err != nil {
		t.Fatal(err)
	}
	// The controller's consumer takes some of the stream's events, as in
	// the farm (others' events are stored between them).
	cons, err := js.CreateOrUpdateConsumer(ctx, mesh.EventsStream, jetstream.ConsumerConfig{Durable: mesh.ModuleConsumer(module),
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubjects: []string{"caughtup.built"}})
	if err != nil {
		t.Fatal(err)
	}
	c := &Controller{js: js, module: module, cfg: Config{IdleLook: time.Hour}}
	now := time.Now()
	if !c.caughtUp(ctx, now) {
		t.Fatal("no events: held")
	}
	pending := func() uint64 {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumPending
	}
	// publish stores one event for the controller between two others', and
	// waits until the consumer counts it pending: the server counts a
	// stored event for a filtered consumer a moment after it acknowledged
	// the publish (under load in CI, a mark taken at once counted one of
	// two).
	publish := func() {
		before := pending()
		for _, subj := range []string{"caughtup.other", "caughtup.built", "caughtup.other"} {
			if _, err := js.Publish(ctx, subj, []byte("{}")); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for pending() != before+1 {
			if time.Now().After(deadline) {
				t.Fatalf("the consumer counts %d pending, want %d", pending(), before+1)
			}
			time.Sleep(time.Millisecond)
		}
	}
	fetch := func() []jetstream.Msg {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var out []jetstream.Msg
		for m := range b.Messages() {
			out = append(out, m)
		}
		if len(out) != 1 {
			t.Fatalf("fetched %d events, want 1", len(out))
		}
		return out
	}
	publish()
	if c.caughtUp(ctx, now) {
		t.Fatal("an event stored and not delivered: handed out")
	}
	got := fetch()
	if c.caughtUp(ctx, now) {
		t.Fatal("an event delivered and not worked: handed out")
	}
	c.saw(got)
	if !c.caughtUp(ctx, now) {
		t.Fatal("every event worked: held")
	}
	// Behind for an idle look at most.
	c.cfg.IdleLook = 20 * time.Millisecond
	publish()
	if c.caughtUp(ctx, now) {
		t.Fatal("an event stored and not delivered: handed out")
	}
	if c.caughtUp(ctx, now.Add(10*time.Millisecond)) {
		t.Fatal("behind for half an idle look: handed out")
	}
	if !c.caughtUp(ctx, now.Add(20*time.Millisecond)) {
		t.Fatal("behind for an idle look: still held")
	}
	if c.caughtUp(ctx, now.Add(21*time.Millisecond)) {
		t.Fatal("still behind after the hand-out it let go: handed out again at once")
	}
	// Delivered before the look and not worked: held; worked: let go.
	c.behind = nil
	got = fetch()
	if c.caughtUp(ctx, now) {
		t.Fatal("an event delivered before the look and not worked: handed out")
	}
	c.saw(got)
	if !c.caughtUp(ctx, now) {
		t.Fatal("every event worked: held")
	}
	// Events stored after the look do not hold it: two waited, the
	// hand-out goes once they are seen, a third published since or not.
	publish()
	publish()
	if c.caughtUp(ctx, now) {
		t.Fatal("two events stored and not delivered: handed out")
	}
	publish()
	first := fetch()
	c.saw(first)
	if c.caughtUp(ctx, now) {
		t.Fatal("one of the two events worked: handed out")
	}
	c.saw(fetch())
	if !c.caughtUp(ctx, now) {
		t.Fatal("the two events stored before the look worked, a later one not: held")
	}
}

// The hand-out waits for the events only while plans of more than one
// priority run: of one priority, waiting would cost every hand-out a look
// and barely move the shares.
func TestTheHandOutWaitsOnlyAcrossPriorities(t *testing.T) {
	for _, c := range []struct {
		prios []int
		want  bool
	}{{nil, false}, {[]int{10}, false}, {[]int{0, 0, 0}, false}, {[]int{0, 10}, true}, {[]int{5, 5, -1}, true}} {
		var claims []Claim
		for _, p := range c.prios {
			claims = append(claims, Claim{Priority: p})
		}
		if got := mixedPriorities(claims); got != c.want {
			t.Errorf("priorities %v: %v, want %v", c.prios, got, c.want)
		}
	}
}
