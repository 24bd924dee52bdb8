package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// An ask redelivered while its holder still works on it — the server heard
// nothing from the holder for longer than the ack wait, as when the bus was
// away — is left to its holder: it is built once.
func TestARedeliveredAskWhoseClaimIsAliveIsLeftToItsHolder(t *testing.T) {
	s, js := bus(t)
	g := newGate()
	// m1 sends no heartbeat (as if cut off from the bus): the server
	// redelivers its ask after the ack wait. Its claim lasts a minute.
	startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) { c.Heartbeat, c.ClaimLease = time.Hour, time.Minute })
	submit(t, js, ask("once"))
	if id := recv(t, g.began, 5*time.Second); id != "once" {
		t.Fatalf("began %s, want once", id)
	}
	ended := make(ends, 10)
	startObserved(t, s, "m2", g.on("m2"), nil, ended)
	ended.next(t, agent.OutcomeHandedBack, 3*testAckWait)
	g.ch("once") <- nil
	r := builtOnce(t, js, 10*time.Second, "once built and acknowledged")
	if len(r.Built) != 1 || r.Built[0].On != "m1" || len(r.Started) != 1 {
		t.Fatalf("started %+v built %+v: want one start and one built, on m1", r.Started, r.Built)
	}
	g.notBegunAgain(t)
}

// settledBy starts agent m1 with w, waits for its outcome done (the ask
// settled without building) and for the ask to leave the queue.
func settledBy(t *testing.T, s *server.Server, js jetstream.JetStream, w agent.Worker) {
	t.Helper()
	ended := make(ends, 10)
	startObserved(t, s, "m1", w, nil, ended)
	ended.next(t, agent.OutcomeDone, 10*time.Second)
	testenv.WaitFor(t, 5*time.Second, "the ask settled", func() bool {
		info := consumerInfo(t, js)
		return info.NumAckPending == 0 && info.NumPending == 0
	})
}

// takeAndNak takes the next ask off the build queue (of the default
// platform), as a holder would, and naks it: it comes again.
func takeAndNak(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	cons, err := js.Consumer(context.Background(), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		_ = m.Nak()
	}
}

// An ask that comes again after its outcome was announced (its holder lost
// the ack) is settled without building.
func TestAnAskWhoseOutcomeWasAnnouncedIsSettledWithoutBuilding(t *testing.T) {
	s, js := bus(t)
	kv, err := js.KeyValue(context.Background(), mesh.AskClaimsBucket(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	done, _ := json.Marshal(map[string]any{"ask": "again", "machine": "m0", "attempt": 1, "outcome": mesh.EventBuilt})
	if _, err := kv.Create(context.Background(), mesh.AskClaimKey("again", "m0"), done); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	w := workerFunc(func(context.Context, mesh.Ask, func(string)) (agent.Result, error) {
		calls.Add(1)
		return agent.Result{Digest: "sha256:" + fmt.Sprintf("%064d", 1)}, nil
	})
	// Its first holder took it and lost the ack: it comes again.
	submit(t, js, ask("again"))
	takeAndNak(t, js)
	settledBy(t, s, js, w)
	if r := events(t, js); calls.Load() != 0 || len(r.Started)+len(r.Built)+len(r.Failed) != 0 {
		t.Fatalf("worked %d times, events %+v: want nothing built or announced", calls.Load(), r)
	}
}

// An ask whose built was announced by its holder, whose acknowledgement
// was lost (the bus went away as it acknowledged), comes back to the same
// machine: the event is announced again as it was, and the machine's claim
// still vouches for it (the attempt it records is the event's). Claimed
// again for the new delivery, the claim would no longer match the event the
// stream keeps, and the controller would refuse the genuine built (seen
// after a three-server cluster regained quorum: the plan hung).
func TestAnAskWhoseAckWasLostIsAnnouncedAgainUnderItsOwnClaim(t *testing.T) {
	s, js := bus(t)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, mesh.AskClaimsBucket(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	a := ask("lost-ack")
	digest := "sha256:" + fmt.Sprintf("%064d", 3)
	built := mesh.Built{Version: mesh.AskVersion, Ask: a.ID, Plan: a.Plan, Module: a.Module, Digest: digest,
		Image: a.Image + "@" + digest, On: "m1", Attempt: 1, At: time.Now().UTC()}
	event, _ := json.Marshal(built)
	const id = "lost-ack-built-0123456789abcdef"
	rec, _ := json.Marshal(map[string]any{"ask": a.ID, "machine": "m1", "attempt": 1, "outcome": mesh.EventBuilt,
		"msg_id": id, "event": json.RawMessage(event)})
	if _, err := kv.Create(ctx, mesh.AskClaimKey(a.ID, "m1"), rec); err != nil {
		t.Fatal(err)
	}
	// m1 announced it, and its acknowledgement was lost: the ask comes again.
	if _, err := js.Publish(ctx, mesh.HolderEventSubject(mesh.BuildSeat, "m1", mesh.EventBuilt), event, jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}
	submit(t, js, a)
	takeAndNak(t, js)
	var calls atomic.Int32
	w := workerFunc(func(context.Context, mesh.Ask, func(string)) (agent.Result, error) {
		calls.Add(1)
		return agent.Result{Digest: digest}, nil
	})
	settledBy(t, s, js, w)
	e, err := kv.Get(ctx, mesh.AskClaimKey(a.ID, "m1"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Attempt int    `json:"attempt"`
		Outcome string `json:"outcome"`
		MsgID   string `json:"msg_id"`
	}
	if err := json.Unmarshal(e.Value(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Attempt != 1 || got.Outcome != mesh.EventBuilt || got.MsgID != id {
		t.Fatalf("m1's claim after the redelivery: %+v, want attempt 1, built, under %s (the event the stream keeps)", got, id)
	}
	r := events(t, js)
	if calls.Load() != 0 || len(r.Built) != 1 || r.Built[0].Attempt != 1 || r.Built[0].On != "m1" {
		t.Fatalf("worked %d times, built events %+v: want the one built, on m1 for attempt 1, and no build", calls.Load(), r.Built)
	}
}

// sickWorker is a machine whose BuildKit can be taken away: while sick,
// every ask fails on infrastructure and so does its probe.
type sickWorker struct {
	sick   atomic.Bool
	probes atomic.Int32
	worked atomic.Int32
}

func (w *sickWorker) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	w.worked.Add(1)
	if w.sick.Load() {
		return agent.Result{}, fmt.Errorf("%w: buildkitd at unix:///x does not answer", agent.ErrInfra)
	}
	return agent.Result{Digest: "sha256:" + fmt.Sprintf("%064d", 7), Ref: a.Image + "@sha256:x"}, nil
}

func (w *sickWorker) Probe(context.Context) error {
	w.probes.Add(1)
	if w.sick.Load() {
		return errors.New("buildkitd at unix:///x does not answer: connection refused")
	}
	return nil
}

// A machine whose BuildKit does not answer stops taking asks, says so,
// probes until it answers and then takes asks again; the asks it could
// not build are built elsewhere, none failed. (Its hand-backs spend the
// asks' budget — a minute here, far more than the test takes: see
// TestAnAskSettlesWhenItsBudgetIsGoneThoughEveryMachineIsSick.)
func TestASickMachineStopsTakingWork(t *testing.T) {
	s, js := bus(t)
	sick := &sickWorker{}
	sick.sick.Store(true)
	health := make(healthSeen, 10)
	noBudget := func(c *agent.Config) { c.RetryFor = time.Minute }
	startObserved(t, s, "sick", sick, noBudget, health)
	for i := range 4 {
		submit(t, js, ask(fmt.Sprintf("s%d", i)))
	}
	if ok := <-health; ok {
		t.Fatal("told healthy first, want unhealthy")
	}
	st := status(t, js, "sick")
	if st.Health != agent.HealthUnhealthy || st.Why == "" {
		t.Fatalf("status %+v: want unhealthy with why", st)
	}
	// It probed before its first pull and took no ask.
	if n := sick.worked.Load(); n != 0 {
		t.Fatalf("the sick machine worked %d asks, want none", n)
	}
	startAgent(t, s, "well", &sickWorker{}, noBudget)
	testenv.WaitFor(t, 20*time.Second, "all built", func() bool { return len(events(t, js).Built) == 4 })
	r := events(t, js)
	for _, b := range r.Built {
		if b.On != "well" {
			t.Errorf("%s built on %s, want well", b.Ask, b.On)
		}
	}
	if len(r.Failed) != 0 || sick.worked.Load() != 0 {
		t.Fatalf("failed %+v, the sick machine worked %d: want no failure and no ask worked", r.Failed, sick.worked.Load())
	}
	// Well again: it probes, says so and takes asks.
	sick.sick.Store(false)
	if ok := <-health; !ok {
		t.Fatal("told unhealthy again, want healthy")
	}
	if st := status(t, js, "sick"); st.Health != agent.HealthHealthy || st.Why != "" {
		t.Fatalf("status %+v: want healthy", st)
	}
	if sick.probes.Load() < 2 {
		t.Errorf("probed %d times, want a probe that failed and one that answered", sick.probes.Load())
	}
}

// healthSeen is an observer that passes on what it is told of health.
type healthSeen chan bool

func (healthSeen) IdleWaited(time.Duration) {}
func (healthSeen) Began()                   {}
func (healthSeen) Ended(agent.End)          {}
func (h healthSeen) Healthy(ok bool)        { h <- ok }

func status(t *testing.T, js jetstream.JetStream, machine string) agent.Status {
	t.Helper()
	sts, err := agent.AskStatus(context.Background(), js.Conn(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.Machine == machine {
			return st
		}
	}
	t.Fatalf("%s did not answer: %+v", machine, sts)
	return agent.Status{}
}

// restartableBus is a server the test may stop and start again on the same
// port and store (its options), with the mesh raised and the holders' ack
// wait testAckWait, and a connection to it.
func restartableBus(t *testing.T) (*server.Options, *server.Server, jetstream.JetStream) {
	t.Helper()
	port, err := strconv.Atoi(strings.Split(testenv.FreeAddr(t), ":")[1])
	if err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{Port: port, StoreDir: t.TempDir()}
	s := natstest.Server(t, opts)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if _, err := mesh.Raise(ctx, js, meshtest.Catalogue(t, nil), 1); err != nil {
		t.Fatal(err)
	}
	spec := mesh.BuildConsumerSpec(mesh.DefaultPlatform, 1)
	spec.Config.AckWait = testAckWait
	if _, err := js.UpdateConsumer(ctx, spec.Stream, spec.Config); err != nil {
		t.Fatal(err)
	}
	return opts, s, js
}

// The operator's trial: the bus is killed during a build for longer than
// the ack wait. On its return the server redelivers the ask to another
// agent while the first still builds; the second leaves it to the first,
// whose claim is alive, and the module is built once.
func TestAnAskIsBuiltOnceAcrossABusOutage(t *testing.T) {
	opts, s, js := restartableBus(t)
	g := newGate()
	// m1's heartbeats would not reach a server that is away; with none at
	// all, the redelivery after the outage is certain.
	startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) { c.Heartbeat, c.ClaimLease = time.Hour, time.Minute })
	submit(t, js, ask("outage"))
	// m1 holds the ask before m2 starts: had both been idle, m2 (the one
	// watched for the hand-back) could have taken it.
	first := recv(t, g.began, 5*time.Second)
	ended := make(ends, 10)
	startObserved(t, s, "m2", g.on("m2"), nil, ended)
	// m2 holds the seat (its claims bucket bound, its status served)
	// before the bus goes.
	testenv.WaitFor(t, 30*time.Second, "m2 holding the seat", func() bool {
		sts, err := agent.AskStatus(context.Background(), js.Conn(), time.Second)
		return err == nil && slices.ContainsFunc(sts, func(st agent.Status) bool { return st.Machine == "m2" })
	})
	s.Shutdown()
	s.WaitForShutdown()
	time.Sleep(testAckWait + 500*time.Millisecond) // the outage: longer than the ack wait
	s = natstest.Server(t, opts)
	_, js = natstest.Connect(t, s)
	if e := ended.next(t, agent.OutcomeHandedBack, 30*time.Second); e.Took != 0 {
		t.Fatalf("the redelivered ask was worked on (%s), want it left to its holder", e.Took)
	}
	g.ch("outage") <- nil
	r := builtOnce(t, js, 30*time.Second, "built and acknowledged")
	if len(r.Built) != 1 || len(r.Started) != 1 || first != "outage" {
		t.Fatalf("started %+v built %+v: want the ask started and built once", r.Started, r.Built)
	}
	g.notBegunAgain(t)
}

// The same outage, longer than the ask claim's lease: m1's claim lapses
// while it builds. It is claimed again as soon as the bus is back, while
// the build goes on, so the ask redelivered to m2 is left to m1 however
// long the build still takes (past the few leases m2 would leave a lapsed
// holder), and the module is built once. Before, m1 claimed it again only
// when its build ended: m2 waited three leases, then built it a second
// time, and m1's build was thrown away.
func TestAnAskWhoseClaimLapsedInAnOutageIsClaimedAgainAtOnce(t *testing.T) {
	opts, s, js := restartableBus(t)
	ctx := context.Background()
	const lease = time.Second
	g := newGate()
	startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) { c.Heartbeat, c.ClaimLease = time.Hour, lease })
	a := ask("lapse")
	a.Secret = "s3cret"
	submit(t, js, a)
	if first := recv(t, g.began, 5*time.Second); first != "lapse" {
		t.Fatalf("began %s", first)
	}
	ended := make(ends, 50)
	startObserved(t, s, "m2", g.on("m2"), func(c *agent.Config) { c.ClaimLease = lease }, ended)
	testenv.WaitFor(t, 30*time.Second, "m2 holding the seat", func() bool {
		sts, err := agent.AskStatus(context.Background(), js.Conn(), time.Second)
		return err == nil && slices.ContainsFunc(sts, func(st agent.Status) bool { return st.Machine == "m2" })
	})
	kv, err := js.KeyValue(ctx, mesh.AskClaimsBucket(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	before, err := kv.Get(ctx, mesh.AskClaimKey(a.ID, "m1"))
	if err != nil {
		t.Fatalf("m1's claim before the outage: %v", err)
	}
	s.Shutdown()
	s.WaitForShutdown()
	time.Sleep(testAckWait + 500*time.Millisecond) // longer than the ack wait and the claim's lease
	s = natstest.Server(t, opts)
	back := time.Now()
	_, js = natstest.Connect(t, s)
	if kv, err = js.KeyValue(ctx, mesh.AskClaimsBucket(mesh.BuildSeat)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "m1's claim written again while it builds", func() bool {
		e, err := kv.Get(ctx, mesh.AskClaimKey(a.ID, "m1"))
		return err == nil && e.Revision() > before.Revision() && !strings.Contains(string(e.Value()), `"released"`)
	})
	t.Logf("claimed again %s after the server returned", time.Since(back).Round(time.Millisecond))
	// The build goes on for five leases more: m2 is handed the ask again
	// and again, and leaves it each time.
	time.Sleep(5 * lease)
	if e := ended.next(t, agent.OutcomeHandedBack, time.Second); e.Took != 0 {
		t.Fatalf("the redelivered ask was worked on (%s), want it left to its holder", e.Took)
	}
	g.notBegunAgain(t)
	g.ch("lapse") <- nil
	r := builtOnce(t, js, 30*time.Second, "built and acknowledged")
	if len(r.Built) != 1 || len(r.Started) != 1 {
		t.Fatalf("started %+v built %+v: want the ask started and built once", r.Started, r.Built)
	}
	g.notBegunAgain(t)
}

// heldSeat is machine's seat claim, held by the test: its token binds the
// machine's ask claims (Config.SeatToken), and away and back take the claim
// from the bucket and put it back as it was, so that the machine's retake
// of a lapsed ask claim waits for the test (agent.retakeEarly waits for its
// seat).
type heldSeat struct {
	t     *testing.T
	lease *claim.Lease
	kv    jetstream.KeyValue
	held  jetstream.KeyValueEntry
}

func holdSeat(t *testing.T, js jetstream.JetStream, machine string) *heldSeat {
	t.Helper()
	ctx := context.Background()
	l, err := claim.Claim(ctx, js, mesh.BuildSeat, claim.Node(machine), claim.Process("build-agent"), claim.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, mesh.ClaimsBucket())
	if err != nil {
		t.Fatal(err)
	}
	held, err := kv.Get(ctx, mesh.ClaimKey(mesh.BuildSeat, machine))
	if err != nil {
		t.Fatal(err)
	}
	return &heldSeat{t: t, lease: l, kv: kv, held: held}
}

func (h *heldSeat) token() string { return h.lease.Token() }

func (h *heldSeat) away() {
	if err := h.lease.Release(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

func (h *heldSeat) back() {
	if _, err := h.kv.Put(context.Background(), h.held.Key(), h.held.Value()); err != nil {
		h.t.Fatal(err)
	}
}

// A redelivery to the very machine that still builds the ask, its claim
// gone from the key and not claimed again yet (seen by hand: a bus frozen
// for longer than the ack wait, then the redelivery on the machine's next
// slot, while the build's own retake was still on its way), is left to
// that build. Claimed by the second slot, the two shared the machine's key,
// overwrote each other's claim, and the module was built twice on it. Here
// the machine's seat claim is away, so its build's retake waits for it.
func TestARedeliveryToTheMachineStillBuildingItIsLeftToThatBuild(t *testing.T) {
	s, js := bus(t)
	ctx := context.Background()
	seat := holdSeat(t, js, "m1")
	g := newGate()
	ended := make(ends, 10)
	startObserved(t, s, "m1", g.on("m1"), func(c *agent.Config) {
		c.Slots, c.SeatToken = 2, seat.token()
		// No heartbeats: the server hands the ask out again after its ack
		// wait. The claim is renewed every second: the build notices at
		// once that its claim is gone, and waits for its seat to retake it.
		c.Heartbeat, c.ClaimLease = time.Hour, 3*time.Second
	}, ended)
	a := ask("again")
	submit(t, js, a)
	if first := recv(t, g.began, 5*time.Second); first != "again" {
		t.Fatalf("began %s", first)
	}
	seat.away()
	kv, err := js.KeyValue(ctx, mesh.AskClaimsBucket(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, mesh.AskClaimKey(a.ID, "m1")); err != nil {
		t.Fatal(err)
	}
	if e := ended.next(t, agent.OutcomeHandedBack, 3*testAckWait); e.Took != 0 {
		t.Fatalf("the ask redelivered to m1 was worked on beside its build (%s), want it left to that build", e.Took)
	}
	g.notBegunAgain(t)
	// The seat back as it was: the build claims the ask again, and ends.
	seat.back()
	testenv.WaitFor(t, 10*time.Second, "m1's build claiming the ask again", func() bool {
		e, err := kv.Get(ctx, mesh.AskClaimKey(a.ID, "m1"))
		return err == nil && strings.Contains(string(e.Value()), `"attempt":1`)
	})
	g.ch("again") <- nil
	r := builtOnce(t, js, 30*time.Second, "built and acknowledged")
	if len(r.Built) != 1 || len(r.Started) != 1 {
		t.Fatalf("started %+v built %+v: want the ask started and built once", r.Started, r.Built)
	}
	g.notBegunAgain(t)
}

// The operator's trial of a frozen bus (by hand: nats-server stopped with
// SIGSTOP for longer than the ack wait and the ask claims' lease). No
// connection drops, so no agent sees a reconnect. m1's claim lapses while
// it builds, and the server hands the ask to m2 as it thaws. m2's own
// claim renewals got no answer in the freeze (claim.WithTrouble): it leaves
// the ask to m1, which claims it again, and the module is built once.
// Before, m2 took the lapsed claim for a dead holder's and built the ask a
// second time, and m1's build was thrown away. m1's seat is away for a
// while after the thaw, so that its own claim comes after m2 has decided.
func TestAnAskIsBuiltOnceAcrossAFrozenBus(t *testing.T) {
	const lease = 2 * time.Second
	builtOnceAcrossAFreeze(t, lease, lease, testAckWait+lease+time.Second, false)
}

// The same trial with an outage that lapses m1's seat claim but not its
// claim of the ask — a seat lease (--lease) shorter than the ask claims',
// or, on a cluster, the seat claims' stream without quorum while the ask
// claims' has it: m1's claim is still there as the bus thaws, but void,
// m1's seat claim gone (here: taken away by the test, as its lease would).
// m2, handed the ask again, saw the bus fail too: it leaves the ask to m1
// (claim.AskFound's SeatLapsed), which claims its seat again, and the
// module is built once. Before, m2 took the void claim for a dead
// machine's and built it.
func TestAnAskWhoseHoldersSeatLapsedInAnOutageIsLeftToItsHolder(t *testing.T) {
	// m1's claim outlasts the freeze; m2's claims are bound to a seat of
	// its own, so that it judges m1's by m1's seat.
	builtOnceAcrossAFreeze(t, 20*time.Second, 2*time.Second, testAckWait+2*time.Second, true)
}

// builtOnceAcrossAFreeze is the frozen-bus trial: m1 builds an ask, its
// claim leased for lease1 and bound to its seat claim; m2 builds one of its
// own on one of two slots (its claims leased for lease2: their renewals
// fail in the freeze, so it sees the bus fail), bound to a seat claim of
// its own when bound2. The bus is frozen for freeze (no heartbeats: the
// server hands both asks out again as it thaws), m1's seat claim is away
// as it thaws (as its lease would have it), and m2 must leave both asks
// to their holders; with m1's seat back, each is built once.
func builtOnceAcrossAFreeze(t *testing.T, lease1, lease2, freeze time.Duration, bound2 bool) {
	s, js := bus(t)
	fz := testenv.Freeze(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	seat := holdSeat(t, js, "m1")
	seat2 := ""
	if bound2 {
		seat2 = holdSeat(t, js, "m2").token()
	}
	g := newGate()
	startObservedAt(t, "nats://"+fz.Addr(), "m1", g.on("m1"), func(c *agent.Config) {
		c.Heartbeat, c.ClaimLease, c.SeatToken = time.Hour, lease1, seat.token()
	}, nil)
	a := ask("frozen")
	submit(t, js, a)
	if first := recv(t, g.began, 5*time.Second); first != a.ID {
		t.Fatalf("began %s", first)
	}
	ended := make(ends, 50)
	startObservedAt(t, "nats://"+fz.Addr(), "m2", g.on("m2"), func(c *agent.Config) {
		c.Slots, c.Heartbeat, c.ClaimLease, c.SeatToken = 2, time.Hour, lease2, seat2
	}, ended)
	submit(t, js, ask("busy"))
	if first := recv(t, g.began, 5*time.Second); first != "busy" {
		t.Fatalf("began %s", first)
	}

	fz.Freeze()
	time.Sleep(freeze)
	seat.away()
	fz.Thaw()
	// Both asks are handed out again as the bus thaws; m2 leaves each to
	// its holder (its own "busy" to that build).
	for range 2 {
		if e := ended.next(t, agent.OutcomeHandedBack, 10*time.Second); e.Took != 0 {
			t.Fatalf("an ask redelivered to m2 was worked on (%s), want it left to its holder", e.Took)
		}
	}
	g.notBegunAgain(t)
	seat.back()
	g.ch(a.ID) <- nil
	g.ch("busy") <- nil
	testenv.WaitFor(t, 30*time.Second, "both asks built and acknowledged", func() bool {
		info := consumerInfo(t, js)
		return len(events(t, js).Built) == 2 && info.NumAckPending == 0 && info.NumPending == 0
	})
	r := events(t, js)
	for _, id := range []string{a.ID, "busy"} {
		var started, built int
		for _, e := range r.Started {
			started += btoi(e.Ask == id)
		}
		for _, e := range r.Built {
			built += btoi(e.Ask == id)
		}
		if started != 1 || built != 1 {
			t.Errorf("%s started %d times and built %d, want once each", id, started, built)
		}
	}
	g.notBegunAgain(t)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// hangingWorker is a gate worker whose builder can stop answering, as a
// buildkitd stopped with SIGSTOP does: its pings wait out their bound.
type hangingWorker struct {
	gateWorker
	hung atomic.Bool
}

func (w *hangingWorker) PingBuilder(ctx context.Context) error {
	if !w.hung.Load() {
		return nil
	}
	<-ctx.Done()
	return fmt.Errorf("%w: buildkitd at unix:///x does not answer: %w", agent.ErrInfra, ctx.Err())
}

func (w *hangingWorker) Probe(ctx context.Context) error { return w.PingBuilder(ctx) }

// A machine whose builder stops answering in the middle of a build (by
// hand: buildkitd stopped with SIGSTOP) stops the build after two pings go
// unanswered, gives the ask back at once and turns sick; another machine
// builds it. Before, the machine held the ask for as long as its daemon
// stood still, shown building all along.
func TestABuildWhoseBuilderStopsAnsweringGoesToAnotherMachine(t *testing.T) {
	s, js := bus(t)
	g := newGate()
	w := &hangingWorker{gateWorker: gateWorker{g, "m1"}}
	ended := make(ends, 10)
	startObserved(t, s, "m1", w, func(c *agent.Config) { c.ProbeEvery, c.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond }, ended)
	submit(t, js, ask("hung"))
	if first := recv(t, g.began, 5*time.Second); first != "hung" {
		t.Fatalf("began %s", first)
	}
	startAgent(t, s, "m2", g.on("m2"), nil)
	hungAt := time.Now()
	w.hung.Store(true)
	e := ended.next(t, agent.OutcomeHandedBack, 5*time.Second)
	t.Logf("handed back %s after the builder stopped answering", time.Since(hungAt).Round(time.Millisecond))
	if st := status(t, js, "m1"); st.Health != agent.HealthUnhealthy {
		t.Errorf("m1 %+v after its builder stopped answering: want unhealthy", st)
	}
	if e.Took == 0 {
		t.Errorf("handed back %+v: want it after the work that was stopped", e)
	}
	if again := recv(t, g.began, 10*time.Second); again != "hung" {
		t.Fatalf("began %s, want hung again on m2", again)
	}
	g.ch("hung") <- nil
	r := builtOnce(t, js, 30*time.Second, "built and acknowledged")
	if r.Built[0].On != "m2" || len(r.Failed) != 0 {
		t.Fatalf("built %+v failed %+v: want it built on m2, nothing failed", r.Built, r.Failed)
	}
	if len(r.Back) == 0 || !strings.Contains(r.Back[0].Why, "does not answer") {
		t.Errorf("handed back %+v: want why (the builder does not answer)", r.Back)
	}
	w.hung.Store(false)
	testenv.WaitFor(t, 10*time.Second, "m1 healthy again", func() bool { return status(t, js, "m1").Health == agent.HealthHealthy })
}

// An idle machine whose BuildKit goes away says so before it takes an ask.
func TestAnIdleMachineIsProbed(t *testing.T) {
	s, js := bus(t)
	w := &sickWorker{}
	health := make(healthSeen, 10)
	startObserved(t, s, "idle", w, func(c *agent.Config) { c.ProbeEvery = 200 * time.Millisecond }, health)
	w.sick.Store(true)
	if ok := <-health; ok {
		t.Fatal("told healthy, want unhealthy")
	}
	if st := status(t, js, "idle"); st.Health != agent.HealthUnhealthy {
		t.Fatalf("status %+v: want unhealthy", st)
	}
	submit(t, js, ask("i1"))
	w.sick.Store(false)
	if ok := <-health; !ok {
		t.Fatal("told unhealthy again, want healthy")
	}
	testenv.WaitFor(t, 10*time.Second, "i1 built", func() bool { return len(events(t, js).Built) == 1 })
	if n := w.worked.Load(); n != 1 {
		t.Fatalf("worked %d asks, want only i1, once it was healthy", n)
	}
}

// unreachableWorker fails every ask on infrastructure that its probe does
// not see (a machine that cannot resolve the repository's host), the
// first once the test lets it.
type unreachableWorker struct {
	first  chan struct{}
	worked atomic.Int32
}

func (w *unreachableWorker) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	if w.worked.Add(1) == 1 {
		select {
		case <-w.first:
		case <-ctx.Done():
		}
	}
	return agent.Result{}, fmt.Errorf("%w: fetching https://git.example/x.git: fatal: Could not resolve host: git.example", agent.ErrInfra)
}

func (w *unreachableWorker) Probe(context.Context) error { return nil }

// A machine that gives an ask back to be retried, for a failure its probe
// does not explain, leaves the retry to a machine that waits idle. The
// server hands a message to the pull that has waited longest, and an idle
// machine renews its pull every --fetch-wait while the failing one pulled
// again at once: past that wait the failing machine was given every retry
// (by hand: one that could not resolve the repository's host took all
// four attempts of an ask while another sat idle).
func TestARetryGoesToAMachineThatWaitsIdle(t *testing.T) {
	s, js := bus(t)
	bad := &unreachableWorker{first: make(chan struct{})}
	ended := make(ends, 10)
	// The retry is due after 2s, four of the idle machine's pulls.
	startObserved(t, s, "m1", bad, func(c *agent.Config) { c.RetryDelay, c.MaxRetryDelay = 2*time.Second, 2*time.Second }, ended)
	submit(t, js, ask("unreachable"))
	testenv.WaitFor(t, 5*time.Second, "m1 working on the ask", func() bool { return bad.worked.Load() == 1 })
	g := newGate()
	startAgent(t, s, "m2", g.on("m2"), nil)
	testenv.WaitFor(t, 10*time.Second, "m2 waiting idle", func() bool { return consumerInfo(t, js).NumWaiting >= 1 })
	close(bad.first)
	if e := ended.next(t, agent.OutcomeRetried, 5*time.Second); e.Reason != mesh.ReasonInfra {
		t.Fatalf("m1's attempt: %+v, want retried for infra", e)
	}
	if again := recv(t, g.began, 10*time.Second); again != "unreachable" {
		t.Fatalf("m2 began %s", again)
	}
	g.ch("unreachable") <- nil
	r := builtOnce(t, js, 10*time.Second, "built on m2")
	if r.Built[0].On != "m2" || bad.worked.Load() != 1 {
		t.Fatalf("built %+v, m1 worked %d times: want the retry built on m2, m1 tried once", r.Built, bad.worked.Load())
	}
}

// A build still going at --build-timeout (a RUN that never ends) is stopped
// and failed{build}, once, naming the bound: not retried, not left holding
// the machine, which takes its next ask. Before, nothing bounded a build
// whose BuildKit and registry answered.
func TestABuildPastItsTimeoutIsFailedOnce(t *testing.T) {
	s, js := bus(t)
	g := newGate()
	startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) { c.BuildTimeout = 500 * time.Millisecond })
	submit(t, js, ask("forever"))
	if id := recv(t, g.began, 5*time.Second); id != "forever" {
		t.Fatalf("began %s", id)
	}
	testenv.WaitFor(t, 10*time.Second, "the build failed", func() bool { return len(events(t, js).Failed) == 1 })
	f := events(t, js).Failed[0]
	if f.Reason != mesh.ReasonBuild || !strings.Contains(f.Message, "--build-timeout 500ms") || len(f.Log) == 0 {
		t.Errorf("failed %+v: want reason build, naming --build-timeout 500ms, with the build's log", f)
	}
	submit(t, js, ask("next"))
	if id := recv(t, g.began, 5*time.Second); id != "next" {
		t.Fatalf("began %s, want the next ask (the one timed out is not tried again)", id)
	}
	g.ch("next") <- nil
	testenv.WaitFor(t, 10*time.Second, "next built", func() bool { return len(events(t, js).Built) == 1 })
	drained(t, js, 5*time.Second)
	if r := events(t, js); len(r.Failed) != 1 {
		t.Errorf("failed %+v: want the one timed out, once", r.Failed)
	}
}

// A machine that fails every ask it takes for a cause of its own that its
// probe does not see (its BuildKit's disk full: by hand, 44 asks of one
// 39-module plan taken and given back, each a fresh ask's first delay,
// while another machine built them all) takes fewer and fewer while
// another waits idle: its cool-off grows with its run of failures.
func TestAMachineThatFailsEveryAskTakesFewerAndFewer(t *testing.T) {
	s, js := bus(t)
	full := &unreachableWorker{first: make(chan struct{})}
	close(full.first)
	// A retry is due after 200ms: each failure alone would keep m1 off the
	// queue for 700ms (with the margin): sixteen asks in 12 s.
	tweak := func(c *agent.Config) { c.RetryDelay, c.MaxRetryDelay = 200*time.Millisecond, 10*time.Second }
	startAgent(t, s, "m1", full, tweak)
	startAgent(t, s, "m2", instant{}, tweak)
	testenv.WaitFor(t, 10*time.Second, "both machines waiting", func() bool { return consumerInfo(t, js).NumWaiting >= 2 })
	n := 0
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); n++ {
		submit(t, js, ask(fmt.Sprintf("a%02d", n)))
		time.Sleep(100 * time.Millisecond)
	}
	testenv.WaitFor(t, 20*time.Second, "every ask built", func() bool { return len(events(t, js).Built) == n })
	// 700ms, 900ms, 1.3s, 2.1s, 3.7s, 6.9s: six in 12 s (two more
	// allowed for a moment m2 was not seen idle).
	if took := full.worked.Load(); took < 1 || took > 8 {
		t.Errorf("m1, failing every ask, took %d of %d: want a few (its cool-off grown with each)", took, n)
	}
	for _, b := range events(t, js).Built {
		if b.On != "m2" {
			t.Errorf("built %+v: want every ask built on m2", b)
		}
	}
}
