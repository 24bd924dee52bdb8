package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// These tests hold the build seat with real agents on a real NATS server;
// the worker stands in for BuildKit (whose own tests are in build_test.go)
// so that the queue's behaviour is what is under test.

const testAckWait = 2 * time.Second

// bus raises the seat on a fresh server, with a short ack wait so that
// redelivery is observable in a test.
func bus(t testing.TB) (*server.Server, jetstream.JetStream) {
	t.Helper()
	return busAckWait(t, testAckWait)
}

// longAckWait is the ack wait of a test that tells a hand-back from a
// redelivery: far longer than any hand-back may take.
const longAckWait = 60 * time.Second

// busAckWait is bus with the consumer's ack wait set to ackWait.
func busAckWait(t testing.TB, ackWait time.Duration) (*server.Server, jetstream.JetStream) {
	t.Helper()
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if _, err := mesh.Raise(ctx, js, meshtest.Catalogue(t, nil), 1); err != nil {
		t.Fatal(err)
	}
	spec := mesh.SeatConsumerSpecs(mesh.Seat{Seat: mesh.BuildSeat, Accepts: []string{mesh.BuildVerb}}, []string{mesh.DefaultPlatform}, 1)[0]
	spec.Config.AckWait = ackWait
	if _, err := js.UpdateConsumer(ctx, spec.Stream, spec.Config); err != nil {
		t.Fatal(err)
	}
	return s, js
}

// gate is a worker that blocks each ask until released, and records how
// many asks each machine worked at once.
type gate struct {
	mu       sync.Mutex
	release  map[string]chan error
	inFlight map[string]int
	maxIn    map[string]int
	began    chan string // ask ids as work begins
}

func newGate() *gate {
	return &gate{release: map[string]chan error{}, inFlight: map[string]int{}, maxIn: map[string]int{}, began: make(chan string, 100)}
}

// notBegunAgain fails t if an ask began again on g.
func (g *gate) notBegunAgain(t *testing.T) {
	t.Helper()
	select {
	case id := <-g.began:
		t.Fatalf("%s was worked on a second time", id)
	default:
	}
}

// drained waits, up to within, until the queue holds no ask, pending or
// unacknowledged (a holder acknowledges an ask just after it announces its
// outcome), and returns what the consumer says then; it fails t if the
// queue does not drain.
func drained(t *testing.T, js jetstream.JetStream, within time.Duration) *jetstream.ConsumerInfo {
	t.Helper()
	var info *jetstream.ConsumerInfo
	testenv.WaitFor(t, within, "the queue drained", func() bool {
		info = consumerInfo(t, js)
		return info.NumPending+uint64(info.NumAckPending) == 0
	})
	return info
}

// builtOnce waits, up to within, until one ask is built and acknowledged
// and nothing is pending (what names the wait), and returns the events.
func builtOnce(t *testing.T, js jetstream.JetStream, within time.Duration, what string) record {
	t.Helper()
	testenv.WaitFor(t, within, what, func() bool {
		info := consumerInfo(t, js)
		return len(events(t, js).Built) == 1 && info.NumAckPending == 0 && info.NumPending == 0
	})
	return events(t, js)
}

func (g *gate) ch(id string) chan error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release[id] == nil {
		g.release[id] = make(chan error, 1)
	}
	return g.release[id]
}

// on returns the worker for one machine.
func (g *gate) on(machine string) agent.Worker { return gateWorker{g, machine} }

type gateWorker struct {
	g       *gate
	machine string
}

func (w gateWorker) Work(ctx context.Context, ask mesh.Ask, log func(string)) (agent.Result, error) {
	g := w.g
	g.mu.Lock()
	g.inFlight[w.machine]++
	g.maxIn[w.machine] = max(g.maxIn[w.machine], g.inFlight[w.machine])
	g.mu.Unlock()
	defer func() { g.mu.Lock(); g.inFlight[w.machine]--; g.mu.Unlock() }()
	g.began <- ask.ID
	log("working on " + ask.ID)
	select {
	case err := <-g.ch(ask.ID):
		if err != nil {
			return agent.Result{}, err
		}
		return agent.Result{Digest: "sha256:" + fmt.Sprintf("%064x", len(ask.ID)), Ref: ask.Image + "@sha256:x"}, nil
	case <-ctx.Done():
		return agent.Result{}, fmt.Errorf("%w: %w", agent.ErrInfra, context.Cause(ctx))
	}
}

type runningAgent struct {
	a      *agent.Agent
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

func startAgent(t testing.TB, s *server.Server, machine string, w agent.Worker, tweak func(*agent.Config)) *runningAgent {
	t.Helper()
	return startObserved(t, s, machine, w, tweak, nil)
}

// startObserved is startAgent with an observer.
func startObserved(t testing.TB, s *server.Server, machine string, w agent.Worker, tweak func(*agent.Config), obs agent.Observer) *runningAgent {
	t.Helper()
	return startObservedAt(t, s.ClientURL(), machine, w, tweak, obs)
}

// startObservedAt is startObserved connecting to url (a proxy to the
// server: testenv.Freeze).
func startObservedAt(t testing.TB, url, machine string, w agent.Worker, tweak func(*agent.Config), obs agent.Observer) *runningAgent {
	t.Helper()
	nc, js := natstest.Dial(t, url)
	cfg := agent.DefaultConfig()
	cfg.Machine = machine
	cfg.Heartbeat = testAckWait / 4
	cfg.FetchWait = 500 * time.Millisecond
	cfg.RetryDelay, cfg.MaxRetryDelay = 100*time.Millisecond, 200*time.Millisecond
	// Every attempt announces started, however short (these tests count
	// attempts by it); the default delay is TestAShortBuildAnnouncesOnlyItsOutcome's.
	cfg.StartedDelay = 0
	// The claim lease is the default: four of the consumer's ack waits, so
	// that a killed agent's ask is taken by another within about five.
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := agent.New(cfg, js, w, nil, obs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ra := &runningAgent{a: a, nc: nc, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(ra.done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ra.done; nc.Close() })
	return ra
}

func ask(id string) mesh.Ask {
	return mesh.Ask{Version: mesh.AskVersion, ID: id, Plan: "p1", Module: "tool",
		Source: mesh.Source{Repo: "https://git.example/x.git", Commit: "abc"}, Image: "127.0.0.1:1/tool"}
}

func submit(t testing.TB, js jetstream.JetStream, a mesh.Ask) {
	t.Helper()
	data, _ := json.Marshal(a)
	if _, err := js.Publish(context.Background(), mesh.BuildSubject(mesh.DefaultPlatform), data, jetstream.WithMsgID(a.ID)); err != nil {
		t.Fatal(err)
	}
}

// record reads every event of the build seat from EVENTS.
type record struct {
	Started []mesh.Started
	Built   []mesh.Built
	Failed  []mesh.Failed
	Back    []mesh.HandedBack
}

func events(t testing.TB, js jetstream.JetStream) record {
	t.Helper()
	ctx := context.Background()
	cons, err := js.OrderedConsumer(ctx, mesh.EventsStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := js.Stream(ctx, mesh.EventsStream)
	info, _ := st.Info(ctx)
	var r record
	for n := uint64(0); n < info.State.Msgs; {
		batch, err := cons.Fetch(int(info.State.Msgs-n), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			_, _, event, _ := mesh.SplitHolderEventSubject(m.Subject())
			switch event {
			case mesh.EventStarted:
				r.Started = appendDecoded(r.Started, m.Data())
			case mesh.EventBuilt:
				r.Built = appendDecoded(r.Built, m.Data())
			case mesh.EventFailed:
				r.Failed = appendDecoded(r.Failed, m.Data())
			case mesh.EventHandedBack:
				r.Back = appendDecoded(r.Back, m.Data())
			}
		}
		if got == 0 {
			break
		}
		n += uint64(got)
	}
	return r
}

// appendDecoded appends the event data holds (what decodes of it) to s.
func appendDecoded[E any](s []E, data []byte) []E {
	var e E
	_ = json.Unmarshal(data, &e)
	return append(s, e)
}

func consumerInfo(t *testing.T, js jetstream.JetStream) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(context.Background(), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func recv(t testing.TB, ch <-chan string, d time.Duration) string {
	t.Helper()
	select {
	case id := <-ch:
		return id
	case <-time.After(d):
		t.Fatalf("nothing began within %s", d)
		return ""
	}
}

func TestTwoAgentsThreeAsksOneAtATime(t *testing.T) {
	s, js := bus(t)
	g := newGate()
	startAgent(t, s, "m1", g.on("m1"), nil)
	startAgent(t, s, "m2", g.on("m2"), nil)
	for _, id := range []string{"a1", "a2", "a3"} {
		submit(t, js, ask(id))
	}
	first, second := recv(t, g.began, 5*time.Second), recv(t, g.began, 5*time.Second)
	// Both agents busy: the third ask waits in the queue, handed to nobody.
	time.Sleep(2 * testAckWait) // past an ack wait: heartbeats keep both asks
	select {
	case id := <-g.began:
		t.Fatalf("%s began while both agents were busy", id)
	default:
	}
	info := consumerInfo(t, js)
	if info.NumAckPending != 2 || info.NumPending != 1 || info.NumRedelivered != 0 {
		t.Fatalf("consumer: ack pending %d (want 2), pending %d (want 1), redelivered %d (want 0)",
			info.NumAckPending, info.NumPending, info.NumRedelivered)
	}
	r := events(t, js)
	on := map[string]string{}
	for _, e := range r.Started {
		on[e.Ask] = e.On
	}
	if len(r.Started) != 2 || on[first] == on[second] {
		t.Fatalf("started %+v: want the two asks on two machines", r.Started)
	}
	// The machine that finishes takes the third.
	g.ch(first) <- nil
	third := recv(t, g.began, 5*time.Second)
	g.ch(second) <- nil
	g.ch(third) <- nil
	testenv.WaitFor(t, 10*time.Second, "three built", func() bool { return len(events(t, js).Built) == 3 })
	r = events(t, js)
	for _, e := range r.Started {
		on[e.Ask] = e.On
	}
	if on[third] != on[first] {
		t.Errorf("third ask ran on %s, want %s (the machine that went idle)", on[third], on[first])
	}
	for m, n := range g.maxIn {
		if n != 1 {
			t.Errorf("machine %s had %d asks in flight at once", m, n)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "the queue drained", func() bool {
		info := consumerInfo(t, js)
		return info.NumAckPending == 0 && info.NumPending == 0
	})
}

// A killed agent's ask is built by another once the ack wait and the
// default claim lease (four ack waits) have passed.
func TestAKilledAgentsAskIsBuiltByAnother(t *testing.T) {
	s, js := bus(t)
	g := newGate()
	a1 := startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) { c.Grace = 0 })
	submit(t, js, ask("k1"))
	recv(t, g.began, 5*time.Second)
	// Kill m1 (as kill -9 would): its connection goes, no ack, no nak, no
	// release of its claim; and its build stops with it.
	a1.nc.Close()
	killed := time.Now()
	a1.cancel()
	<-a1.done
	// Its connection closed for good, it does not wait for the bus to
	// hand its claim back (which no try could).
	if took := time.Since(killed); took > 5*time.Second {
		t.Errorf("m1, its connection closed, took %s to stop", took.Round(time.Millisecond))
	}
	startAgent(t, s, "m2", g.on("m2"), nil)
	// The claim lease by default is three quarters of the ack wait: within
	// the ack wait (and room for a loaded machine) m2 has it.
	bound := testAckWait + 3*time.Second
	id := recv(t, g.began, bound)
	if id != "k1" {
		t.Fatalf("m2 began %s, want k1", id)
	}
	t.Logf("the killed agent's ask was taken %s after the kill (ack wait %s)", time.Since(killed).Round(time.Millisecond), testAckWait)
	g.ch("k1") <- nil
	testenv.WaitFor(t, 10*time.Second, "k1 built", func() bool { return len(events(t, js).Built) >= 1 })
	// m1 is gone (Run returned), so only m2 can still announce; once k1
	// is acknowledged nothing can redeliver it either.
	testenv.WaitFor(t, 10*time.Second, "k1 acknowledged", func() bool {
		info := consumerInfo(t, js)
		return info.NumAckPending == 0 && info.NumPending == 0
	})
	r := events(t, js)
	if len(r.Built) != 1 || r.Built[0].On != "m2" {
		t.Fatalf("built %+v: want exactly one, on m2", r.Built)
	}
}

// With the shipped settings (the holders' ack wait, the default claim
// lease), an idle machine starts a killed machine's ask within seconds —
// about the ack wait — not the minutes of an ack wait plus a long lease
// (issue 20: 111-118 s before).
func TestAKilledMachinesAskIsStartedElsewhereInSeconds(t *testing.T) {
	took, js := killToStarted(t, "k9")
	t.Logf("kill -9 to started elsewhere: %s (ack wait %s)", took.Round(time.Millisecond), mesh.HolderAckWait)
	testenv.WaitFor(t, 10*time.Second, "k9 built on m2", func() bool {
		r := events(t, js)
		return len(r.Built) == 1 && r.Built[0].On == "m2"
	})
}

func TestABuildLongerThanTheAckWaitIsNotRedelivered(t *testing.T) {
	s, js := bus(t)
	g := newGate()
	startAgent(t, s, "m1", g.on("m1"), nil)
	startAgent(t, s, "m2", g.on("m2"), nil)
	submit(t, js, ask("long"))
	recv(t, g.began, 5*time.Second)
	time.Sleep(3 * testAckWait)
	select {
	case id := <-g.began:
		t.Fatalf("%s was redelivered while its agent heartbeated", id)
	default:
	}
	if info := consumerInfo(t, js); info.NumRedelivered != 0 || info.NumAckPending != 1 {
		t.Fatalf("redelivered %d ack pending %d", info.NumRedelivered, info.NumAckPending)
	}
	g.ch("long") <- nil
	testenv.WaitFor(t, 5*time.Second, "built", func() bool { return len(events(t, js).Built) == 1 })
	if r := events(t, js); len(r.Started) != 1 || r.Started[0].Attempt != 1 {
		t.Fatalf("started %+v: want one, attempt 1", r.Started)
	}
}

func TestAMalformedAskIsRefusedOnce(t *testing.T) {
	s, js := bus(t)
	startAgent(t, s, "m1", newGate().on("m1"), nil)
	subj := mesh.BuildSubject(mesh.DefaultPlatform)
	bad := map[string][]byte{
		"garbage":  []byte("{not json"),
		"garbage2": []byte("[1, 2]"),
		"version":  []byte(`{"version": 99, "id": "v99"}`),
		"fields":   []byte(`{"version": 1, "id": "nomodule", "plan": "p"}`),
	}
	for id, data := range bad {
		if _, err := js.Publish(context.Background(), subj, data, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "four failed{ask}", func() bool { return len(events(t, js).Failed) == 4 })
	time.Sleep(2 * testAckWait)
	r := events(t, js)
	if len(r.Failed) != 4 || len(r.Started) != 0 {
		t.Fatalf("failed %d started %d: want 4 and 0", len(r.Failed), len(r.Started))
	}
	for _, f := range r.Failed {
		if f.Reason != mesh.ReasonAsk || f.Message == "" {
			t.Errorf("failed %+v: want reason ask and a message", f)
		}
	}
	if info := consumerInfo(t, js); info.NumPending != 0 || info.NumAckPending != 0 || info.NumRedelivered != 0 {
		t.Fatalf("malformed asks left in the queue: %+v", info)
	}
}

func TestStoppingHandsTheAskBackAtOnce(t *testing.T) {
	// A 60 s ack wait and a hand-back expected within 5 s: without the
	// hand-back the ask would come back only after the ack wait.
	s, js := busAckWait(t, longAckWait)
	g := newGate()
	a1 := startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) { c.Grace = 200 * time.Millisecond })
	submit(t, js, ask("term"))
	recv(t, g.began, 5*time.Second)
	startAgent(t, s, "m2", g.on("m2"), nil)
	stopped := time.Now()
	a1.cancel() // what SIGTERM does in cmd/build-agent
	const handBack = 5 * time.Second
	id := recv(t, g.began, handBack)
	took := time.Since(stopped)
	if id != "term" {
		t.Fatalf("began %s, want term", id)
	}
	if took >= handBack || took >= longAckWait {
		t.Fatalf("taken after %s: want a hand-back within %s (the ack wait is %s)", took, handBack, longAckWait)
	}
	if info := consumerInfo(t, js); info.NumRedelivered != 1 {
		t.Errorf("redelivered %d: want the one ask handed back", info.NumRedelivered)
	}
	<-a1.done
	g.ch("term") <- nil
	testenv.WaitFor(t, 5*time.Second, "built", func() bool { return len(events(t, js).Built) == 1 })
	r := events(t, js)
	if len(r.Failed) != 0 || r.Built[0].On != "m2" {
		t.Fatalf("failed %+v built %+v: want no failure and built on m2", r.Failed, r.Built)
	}
}

func TestInfrastructureFailuresAreRetriedThenReported(t *testing.T) {
	s, js := bus(t)
	var calls atomic.Int32
	flaky := workerFunc(func(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
		n := calls.Add(1)
		if a.ID == "flaky" && n <= 2 {
			return agent.Result{}, fmt.Errorf("%w: registry unreachable", agent.ErrInfra)
		}
		if a.ID == "gone" {
			return agent.Result{}, fmt.Errorf("%w: registry gone for good", agent.ErrInfra)
		}
		return agent.Result{Digest: "sha256:" + fmt.Sprintf("%064d", 1)}, nil
	})
	// Delays long enough that the gaps between attempts show them: each
	// gap is at least the delay asked for, and the delay doubles. The
	// budget is time: attempt 2 comes ~400ms after the first failure,
	// inside it; attempt 3 at least 1.2s after, past it.
	startAgent(t, s, "m1", flaky, func(c *agent.Config) {
		c.RetryFor, c.RetryDelay, c.MaxRetryDelay = 1100*time.Millisecond, 400*time.Millisecond, 2*time.Second
	})
	submit(t, js, ask("flaky"))
	testenv.WaitFor(t, 10*time.Second, "flaky built", func() bool { return len(events(t, js).Built) == 1 })
	submit(t, js, ask("gone"))
	testenv.WaitFor(t, 10*time.Second, "gone failed", func() bool { return len(events(t, js).Failed) == 1 })
	r := events(t, js)
	if f := r.Failed[0]; f.Ask != "gone" || f.Reason != mesh.ReasonInfra || f.Attempt != 3 {
		t.Fatalf("failed %+v: want gone, infra, attempt 3", f)
	}
	// The retries waited and the wait grew: attempt 2 came at least 400ms
	// after attempt 1, attempt 3 at least 800ms after attempt 2. A delay of
	// zero or a constant one fails here.
	var at []time.Time
	for _, e := range r.Started {
		if e.Ask == "gone" {
			at = append(at, e.At)
		}
	}
	if len(at) != 3 {
		t.Fatalf("gone started %d times, want 3", len(at))
	}
	for i, want := range []time.Duration{400 * time.Millisecond, 800 * time.Millisecond} {
		if gap := at[i+1].Sub(at[i]); gap < want {
			t.Errorf("attempt %d began %s after attempt %d: want at least %s", i+2, gap, i+1, want)
		}
	}
	if info := consumerInfo(t, js); info.NumPending != 0 || info.NumAckPending != 0 {
		t.Fatalf("left in the queue: %+v", info)
	}
}

func TestDeterministicFailuresAreSettledOnce(t *testing.T) {
	s, js := bus(t)
	var calls atomic.Int32
	broken := workerFunc(func(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
		calls.Add(1)
		log("step 1/2: RUN false")
		return agent.Result{}, fmt.Errorf("%w: process \"/bin/sh -c false\" did not complete successfully: exit code: 1", agent.ErrBuild)
	})
	startAgent(t, s, "m1", broken, nil)
	submit(t, js, ask("broken"))
	testenv.WaitFor(t, 5*time.Second, "failed", func() bool { return len(events(t, js).Failed) == 1 })
	time.Sleep(2 * testAckWait)
	r := events(t, js)
	if len(r.Failed) != 1 || r.Failed[0].Reason != mesh.ReasonBuild || calls.Load() != 1 {
		t.Fatalf("failed %+v after %d calls: want one failed{build}", r.Failed, calls.Load())
	}
	if len(r.Failed[0].Log) == 0 {
		t.Errorf("failed carries no log lines")
	}
}

func TestStatusIsAnsweredByEveryAgent(t *testing.T) {
	s, _ := bus(t)
	startAgent(t, s, "m1", newGate().on("m1"), nil)
	startAgent(t, s, "m2", newGate().on("m2"), func(c *agent.Config) { c.Slots = 2 })
	nc, _ := natstest.Connect(t, s)
	// The agents serve status once they hold the seat: ask until both
	// answer (each ask waits for the answers of those that do).
	var got []agent.Status
	testenv.WaitFor(t, 10*time.Second, "both agents to answer", func() bool {
		var err error
		got, err = agent.AskStatus(context.Background(), nc, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return len(got) == 2
	})
	slots := map[string]int{}
	for _, st := range got {
		slots[st.Machine] = st.Slots
	}
	if slots["m1"] != 1 || slots["m2"] != 2 {
		t.Fatalf("status %+v", got)
	}
}

type workerFunc func(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error)

func (f workerFunc) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	return f(ctx, a, log)
}

var _ = errors.New

func TestAnAskForAModuleTheCatalogueDoesNotBuildIsRefused(t *testing.T) {
	s, js := bus(t)
	g := newGate()
	startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) {
		c.Known = func(m string) bool { return m == "tool" }
	})
	a := ask("stranger")
	a.Module = "stranger"
	submit(t, js, a)
	testenv.WaitFor(t, 5*time.Second, "failed{ask}", func() bool { return len(events(t, js).Failed) == 1 })
	if f := events(t, js).Failed[0]; f.Reason != mesh.ReasonAsk || f.Ask != "stranger" {
		t.Fatalf("failed %+v: want reason ask", f)
	}
	submit(t, js, ask("known"))
	if id := recv(t, g.began, 5*time.Second); id != "known" {
		t.Fatalf("began %s, want known", id)
	}
	g.ch("known") <- nil
	testenv.WaitFor(t, 5*time.Second, "known built", func() bool { return len(events(t, js).Built) == 1 })
	if info := drained(t, js, 5*time.Second); info.NumRedelivered != 0 {
		t.Fatalf("queue %+v", info)
	}
}

// ends is an Observer that passes every End on.
type ends chan agent.End

func (ends) IdleWaited(time.Duration) {}
func (ends) Began()                   {}
func (e ends) Ended(x agent.End)      { e <- x }

// next waits for the next End of outcome o, skipping others.
func (e ends) next(t *testing.T, o agent.Outcome, d time.Duration) agent.End {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case x := <-e:
			if x.Outcome == o {
				return x
			}
			t.Logf("(skipped an end: %+v)", x)
		case <-timeout:
			t.Fatalf("no %s within %s", o, d)
		}
	}
}

func TestABuildThatFinishesWithinTheGraceIsBuiltAndNothingNewIsFetched(t *testing.T) {
	s, js := busAckWait(t, longAckWait)
	g := newGate()
	a1 := startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) { c.Grace = longAckWait })
	submit(t, js, ask("in-hand"))
	recv(t, g.began, 5*time.Second)
	submit(t, js, ask("next"))
	stopped := time.Now()
	a1.cancel() // SIGTERM: no new asks; in-hand may finish within the grace
	// The build finishes well within the grace: Run returns as soon as it
	// is settled, not when the grace runs out.
	g.ch("in-hand") <- nil
	select {
	case <-a1.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not stop after its last build was settled")
	}
	if took := time.Since(stopped); took >= longAckWait/2 {
		t.Fatalf("stopping took %s: the agent waited out its grace", took)
	}
	r := events(t, js)
	if len(r.Built) != 1 || r.Built[0].Ask != "in-hand" || len(r.Failed) != 0 || len(r.Started) != 1 {
		t.Fatalf("built %+v failed %+v started %+v: want in-hand built, nothing else", r.Built, r.Failed, r.Started)
	}
	select {
	case id := <-g.began:
		t.Fatalf("%s began on a stopping agent", id)
	default:
	}
	// in-hand acknowledged; next never delivered: it waits for a machine.
	if info := consumerInfo(t, js); info.NumAckPending != 0 || info.NumPending != 1 || info.NumRedelivered != 0 || info.Delivered.Consumer != 1 {
		t.Fatalf("consumer %+v: want nothing in flight, next waiting, one delivery in all", info)
	}
}

// A build that finishes as its cancel comes — the worker ignores the
// cancel and returns an image — is still not announced built: once Cancel
// has claimed the ask, its outcome is failed{cancelled}.
func TestABuildCancelledAsItFinishesIsNotAnnouncedBuilt(t *testing.T) {
	s, js := bus(t)
	began := make(chan struct{})
	stubborn := workerFunc(func(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
		close(began)
		<-ctx.Done() // finishes only once cancelled, and ignores it
		return agent.Result{Digest: "sha256:" + fmt.Sprintf("%064d", 7), Ref: a.Image + "@sha256:x"}, nil
	})
	ra := startAgent(t, s, "m1", stubborn, nil)
	submit(t, js, ask("late"))
	select {
	case <-began:
	case <-time.After(5 * time.Second):
		t.Fatal("the build never began")
	}
	if !ra.a.Cancel("late") {
		t.Fatal("Cancel: the agent says it is not building late")
	}
	if ra.a.Cancel("elsewhere") {
		t.Fatal("Cancel claimed an ask the agent is not building")
	}
	testenv.WaitFor(t, 5*time.Second, "failed{cancelled}", func() bool { return len(events(t, js).Failed) == 1 })
	testenv.WaitFor(t, 5*time.Second, "the ask settled", func() bool {
		info := consumerInfo(t, js)
		return info.NumAckPending == 0 && info.NumPending == 0
	})
	r := events(t, js)
	if f := r.Failed[0]; f.Reason != mesh.ReasonCancel || len(r.Built) != 0 {
		t.Fatalf("failed %+v built %+v: want failed{cancelled} and no built", r.Failed, r.Built)
	}
	if ra.a.Cancel("late") {
		t.Fatal("Cancel claimed an ask already settled")
	}
}

// A pull of 10 s or more is heard from about every half of its wait (not
// every 5 s, nats.go's default, which at 10,000 machines is 2,000
// heartbeats a second), and it still takes an ask at once: the heartbeat
// keeps it, it is not renewed. A stopping agent does not wait it out.
func TestALongPullIsHeardFromEveryHalfOfItsWait(t *testing.T) {
	const wait = 16 * time.Second
	if got := agent.PullHeartbeat(wait); got != wait/2-time.Second {
		t.Fatalf("PullHeartbeat(%s) = %s, want %s", wait, got, wait/2-time.Second)
	}
	if got := agent.PullHeartbeat(5 * time.Second); got != 0 {
		t.Errorf("PullHeartbeat(5s) = %s, want none (renewed soon enough)", got)
	}
	s, js := bus(t)
	watch, _ := natstest.Dial(t, s.ClientURL())
	beats := make(chan time.Time, 16)
	var pulls atomic.Int32
	if _, err := watch.Subscribe(">", func(m *nats.Msg) {
		switch {
		case m.Header.Get("Status") == "100":
			beats <- time.Now()
		case strings.HasPrefix(m.Subject, "$JS.API.CONSUMER.MSG.NEXT."):
			pulls.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	g := newGate()
	began := time.Now()
	ra := startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) { c.FetchWait = wait })
	var beat time.Time
	select {
	case beat = <-beats:
	case <-time.After(wait):
		t.Fatalf("no heartbeat within the pull's wait of %s", wait)
	}
	if since := beat.Sub(began); since < wait/2-2*time.Second {
		t.Fatalf("the first heartbeat came %s after the agent started, want about %s", since.Round(time.Millisecond), wait/2)
	}
	submit(t, js, ask("after-a-beat"))
	recv(t, g.began, 2*time.Second)
	if n := pulls.Load(); n != 1 {
		t.Errorf("%d pulls before the ask was taken, want the one (heard from, not renewed)", n)
	}
	g.ch("after-a-beat") <- nil
	testenv.WaitFor(t, 5*time.Second, "built", func() bool { return len(events(t, js).Built) == 1 })
	// Stopping does not wait out the next pull's 16 s.
	t0 := time.Now()
	ra.cancel()
	<-ra.done
	if took := time.Since(t0); took > 3*time.Second {
		t.Errorf("stopping took %s: the long pull was waited out", took)
	}
}

// TestAShortBuildAnnouncesOnlyItsOutcome: with the default StartedDelay, a
// build that ends within it announces its built and no started; one that
// goes on longer announces started while it builds, stored before its
// built; and a build that fails as soon announces only its failed.
func TestAShortBuildAnnouncesOnlyItsOutcome(t *testing.T) {
	s, js := bus(t)
	startAgent(t, s, "m1", workerFunc(func(ctx context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
		switch a.ID {
		case "slow":
			time.Sleep(3 * agent.DefaultStartedDelay)
		case "broken":
			return agent.Result{}, fmt.Errorf("%w: Dockerfile:1: unknown instruction: FORM", agent.ErrBuild)
		}
		return instant{}.Work(ctx, a, nil)
	}), func(c *agent.Config) { c.StartedDelay = agent.DefaultStartedDelay })
	for _, id := range []string{"quick", "slow", "broken"} {
		submit(t, js, ask(id))
		testenv.WaitFor(t, 10*time.Second, id+" settled", func() bool {
			r := events(t, js)
			return slices.ContainsFunc(r.Built, func(b mesh.Built) bool { return b.Ask == id }) ||
				slices.ContainsFunc(r.Failed, func(f mesh.Failed) bool { return f.Ask == id })
		})
	}
	var order []string // "<event> <ask>", as stored
	cons, err := js.OrderedConsumer(context.Background(), mesh.EventsStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		_, _, event, _ := mesh.SplitHolderEventSubject(m.Subject())
		var v struct {
			Ask string `json:"ask"`
		}
		_ = json.Unmarshal(m.Data(), &v)
		order = append(order, event+" "+v.Ask)
	}
	want := []string{"built quick", "started slow", "built slow", "failed broken"}
	if !slices.Equal(order, want) {
		t.Fatalf("the stream holds %q, want %q", order, want)
	}
}
