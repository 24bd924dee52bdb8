package seat_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/seat"
)

var (
	errA = errors.New("a")
	errB = errors.New("b")
)

func TestAnErrorWrappingTwoSentinelsHasTheFirstEntrysCode(t *testing.T) {
	both := fmt.Errorf("%w and %w", errB, errA)
	ab := seat.Codes{{Code: "a", Sentinels: []error{errA}}, {Code: "b", Sentinels: []error{errB, errA}}}
	ba := seat.Codes{{Code: "b", Sentinels: []error{errB, errA}}, {Code: "a", Sentinels: []error{errA}}}
	for range 100 {
		if got := ab.Of(both); got != "a" {
			t.Fatalf("ab.Of = %q, want a", got)
		}
		if got := ba.Of(both); got != "b" {
			t.Fatalf("ba.Of = %q, want b", got)
		}
	}
	if got := ab.Of(errors.New("other")); got != "" {
		t.Errorf("an unclassified error has code %q", got)
	}
	e := ab.Error("b", "the message")
	if !errors.Is(e, errB) || !errors.Is(e, errA) {
		t.Errorf("code b does not match both its sentinels")
	}
	if e := ab.Error("a", "m"); errors.Is(e, errB) {
		t.Errorf("code a matches b's sentinel")
	}
	if e.Error() != "the message" {
		t.Errorf("message %q", e.Error())
	}
	if errors.Is(ab.Error("unknown", "m"), errA) {
		t.Errorf("an unknown code matches a sentinel")
	}
}

type req struct {
	N int `json:"n"`
}

type rep struct {
	N     int    `json:"n,omitempty"`
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`
}

func (r rep) Failure() (string, string) { return r.Error, r.Code }

// TestToolsServedThroughAnInbox serves tools whose requests are worked on
// one owner goroutine, and calls them on a real server.
func TestToolsServedThroughAnInbox(t *testing.T) {
	s := natstest.Server(t, nil)
	nc, _ := natstest.Connect(t, s)
	codes := seat.Codes{{Code: "a", Sentinels: []error{errA}}, {Code: "b", Sentinels: []error{errB}}}
	inbox := make(seat.Inbox[req, rep])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the owner
		for {
			select {
			case <-ctx.Done():
				return
			case l := <-inbox:
				if l.Q.N < 0 {
					err := fmt.Errorf("%w: negative %d", errB, l.Q.N)
					l.Answer(rep{Error: err.Error(), Code: codes.Of(err)})
					continue
				}
				l.Answer(rep{N: l.Q.N * 2})
			}
		}
	}()
	double := seat.Tool{Name: "double", Subject: "test.tool.double"}
	slow := seat.Tool{Name: "slow", Subject: "test.tool.slow"}
	subs, err := seat.Serve(nc, []seat.Tool{double, slow}, time.Second, func(ctx context.Context, tool string, q req) rep {
		if tool == "slow" {
			time.Sleep(2 * time.Second)
		}
		r, err := inbox.Do(ctx, q)
		if err != nil {
			return rep{Error: err.Error()}
		}
		return r
	}, func(err error) rep { return rep{Error: "malformed: " + err.Error(), Code: "b"} })
	for _, sub := range subs {
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err != nil {
		t.Fatal(err)
	}

	r, err := seat.Call[rep](ctx, nc, "the test", double, req{N: 21}, codes)
	if err != nil || r.N != 42 {
		t.Fatalf("double 21 = %+v, %v", r, err)
	}
	_, err = seat.Call[rep](ctx, nc, "the test", double, req{N: -1}, codes)
	var se *seat.Error
	if !errors.Is(err, errB) || errors.Is(err, errA) || !errors.As(err, &se) || se.Code != "b" {
		t.Fatalf("an error answer: %v (%#v)", err, err)
	}
	if err.Error() != "b: negative -1" {
		t.Errorf("the message is not the server's, once: %q", err.Error())
	}
	m, err := nc.Request(double.Subject, []byte("{not json"), 5*time.Second)
	if err != nil || !bytesContain(m, "malformed") {
		t.Errorf("a malformed request: %v", err)
	}
	_, err = seat.Call[rep](ctx, nc, "the test", seat.Tool{Name: "none", Subject: "test.tool.none"}, req{}, codes)
	if !errors.Is(err, seat.ErrNoController) {
		t.Errorf("nobody serving: %v", err)
	}
	start := time.Now()
	_, err = seat.Call[rep](context.Background(), nc, "the test", slow, req{N: 1}, codes, seat.WithTimeout(300*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 1500*time.Millisecond {
		t.Errorf("WithTimeout(300ms) on a 2s tool: %v after %v", err, time.Since(start))
	}
}

func bytesContain(m *nats.Msg, s string) bool {
	return m != nil && strings.Contains(string(m.Data), s)
}

// TestOpenBucketNamesTheDeclarationItNeeds: the refusal names the bucket
// and the state the manifest must declare.
func TestOpenBucketNamesTheDeclarationItNeeds(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if _, err := seat.OpenBucket(ctx, js, "ctl", "plans"); err == nil || !strings.Contains(err.Error(), mesh.KVBucket("ctl", "plans")) || !strings.Contains(err.Error(), `state "plans"`) {
		t.Fatalf("opening a missing bucket: %v", err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: mesh.KVBucket("ctl", "plans")}); err != nil {
		t.Fatal(err)
	}
	kv, err := seat.OpenBucket(ctx, js, "ctl", "plans")
	if err != nil || kv.Bucket() != mesh.KVBucket("ctl", "plans") {
		t.Fatalf("opening the bucket: %v", err)
	}
}

func workQueue(t *testing.T, js jetstream.JetStream) jetstream.Consumer {
	t.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateConsumer(ctx, "WORK", jetstream.ConsumerConfig{Durable: "holders", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// TestStopHandsBackWhatWasNotWorked: a consumption stopped with fetched
// messages in hand naks them, so the next consumption has them at once, not
// after the ack wait (a minute here).
func TestStopHandsBackWhatWasNotWorked(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	workQueue(t, js)
	ctx := context.Background()
	for i := range 5 {
		if _, err := js.Publish(ctx, fmt.Sprintf("work.%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	c, err := seat.Consume(ctx, js, "WORK", "holders", 5, "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	first := <-c.Messages()
	if err := first.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the rest of the batch reaches the client
	c.Stop()
	c.Stop() // twice is fine

	again, err := seat.Consume(ctx, js, "WORK", "holders", 5, "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Stop()
	got := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for len(got) < 4 {
		select {
		case m := <-again.Messages():
			got[m.Subject()] = true
			_ = m.Ack()
		case <-timeout:
			t.Fatalf("after a stop, the next consumption had %d of the 4 messages not worked in 10s (an ack wait is a minute)", len(got))
		}
	}
	if got[first.Subject()] {
		t.Errorf("the acknowledged message %s came again", first.Subject())
	}
}

// A holder gone with messages in hand — fetched, not acknowledged, not
// handed back: killed with -9, or stopped with SIGSTOP and its seat taken —
// left them to the ack wait (a minute here). The next consumption takes
// them back: delivered again at once. What the gone holder acknowledged
// before does not come again.
func TestAConsumptionTakesBackWhatAGoneHolderHadInHand(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	workQueue(t, js)
	ctx := context.Background()
	for i := range 4 {
		if _, err := js.Publish(ctx, fmt.Sprintf("work.%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	// The gone holder, on a connection of its own: it acknowledges the
	// first, holds the next two and is cut off (its connection closed, as
	// a killed process's is; nothing handed back).
	gnc, gjs := natstest.Connect(t, s)
	gone, err := gjs.Consumer(ctx, "WORK", "holders")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := gone.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for m := range batch.Messages() {
		if len(held) == 0 && m.Subject() == "work.0" {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
			held = append(held, "")
			continue
		}
		held = append(held, m.Subject())
	}
	if len(held) != 3 {
		t.Fatalf("the gone holder fetched %d, want 3", len(held))
	}
	gnc.Close()

	var log testenv.Buffer
	c, err := seat.Consume(ctx, js, "WORK", "holders", 5, "work", slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	got := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for len(got) < 3 {
		select {
		case m := <-c.Messages():
			got[m.Subject()] = true
			_ = m.Ack()
		case <-timeout:
			t.Fatalf("the next consumption had %v of work.1-3 in 10s (the ack wait is a minute): what the gone holder had in hand was not taken back", got)
		}
	}
	if got["work.0"] {
		t.Error("work.0, acknowledged by the gone holder, came again")
	}
	if !strings.Contains(log.String(), "took back") {
		t.Errorf("the log does not say what was taken back:\n%s", log.String())
	}
}

// TestAConsumerDeletedEndsTheConsumption: the channel closes and Err says
// why.
func TestAConsumerDeletedEndsTheConsumption(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	workQueue(t, js)
	ctx := context.Background()
	c, err := seat.Consume(ctx, js, "WORK", "holders", 1, "work", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	// One message through, and a moment for the next pull request to reach
	// the server: a pull that arrives after the delete is not answered.
	if _, err := js.Publish(ctx, "work.1", nil); err != nil {
		t.Fatal(err)
	}
	if m := <-c.Messages(); m == nil || m.Ack() != nil {
		t.Fatal("the first message did not come")
	}
	time.Sleep(300 * time.Millisecond)
	if err := js.DeleteConsumer(ctx, "WORK", "holders"); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-c.Messages():
		if ok {
			t.Fatal("a message from a deleted consumer")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the consumption did not end in 20s after its consumer was deleted")
	}
	if c.Err() == nil {
		t.Error("Err is nil after the consumer was deleted")
	}
	if _, err := seat.Consume(ctx, js, "WORK", "holders", 1, "work", nil); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("binding a missing consumer: %v", err)
	}
}

// The controller's module is the holder of mesh-controller that declares
// the bucket: in the example fleet, build-controller for the plans and the
// declarations; none for a bucket no holder declares, or a module that is
// not a holder.
func TestControllerModuleDeclaresTheBucket(t *testing.T) {
	cat := meshtest.Catalogue(t, map[string][]string{"app": nil})
	for _, c := range []struct {
		name, bucket, want string
		ok                 bool
	}{
		{"", "plans", "build-controller", true},
		{"build-controller", "declarations", "build-controller", true},
		{"", "no-such-bucket", "", false},
		{"build-agent", "plans", "", false},
		{"app", "plans", "", false},
	} {
		got, ok := seat.ControllerModule(cat, c.name, c.bucket)
		if got != c.want || ok != c.ok {
			t.Errorf("ControllerModule(%q, %q) = %q, %v; want %q, %v", c.name, c.bucket, got, ok, c.want, c.ok)
		}
	}
}
