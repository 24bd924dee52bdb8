package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// restartable is a real server the test stops and starts again on the same
// port and store, as an operator restarting nats-server does.
type restartable struct {
	t    *testing.T
	opts server.Options
	s    *server.Server
}

func newRestartable(t *testing.T) *restartable {
	t.Helper()
	r := &restartable{t: t, opts: server.Options{Port: natstest.FreePortRun(t, 1), StoreDir: t.TempDir()}}
	r.s = natstest.Server(t, &r.opts)
	return r
}

func (r *restartable) stop() { r.s.Shutdown(); r.s.WaitForShutdown() }

func (r *restartable) start() { r.s = natstest.Server(r.t, &r.opts) }

// raisedRestartable is a restartable server with the mesh's own catalogue
// raised on it, and a connection to it.
func raisedRestartable(t *testing.T) (*restartable, jetstream.JetStream) {
	t.Helper()
	srv := newRestartable(t)
	_, js := natstest.Connect(t, srv.s)
	if _, err := mesh.Raise(context.Background(), js, meshtest.Catalogue(t, nil), 1); err != nil {
		t.Fatal(err)
	}
	return srv, js
}

// startAgent runs build-agent (RunAgent) with opts as machine, with the
// agent's default config (changed by tweaks) and a workspace of its own,
// until ctx ends; the channel says how it ended.
func startAgent(t *testing.T, ctx context.Context, machine string, opts AgentOptions, tweaks ...func(*agent.Config)) <-chan error {
	t.Helper()
	opts.Agent = agent.DefaultConfig()
	opts.Agent.Machine = machine
	for _, tweak := range tweaks {
		tweak(&opts.Agent)
	}
	opts.Workspace = t.TempDir()
	done := make(chan error, 1)
	go func() { done <- RunAgent(ctx, opts) }()
	return done
}

// awaitLog waits, 30s at most, for log to say say (the wait is what): the
// daemon stopping first (its end said on done) fails t.
func awaitLog(t *testing.T, what string, log *testenv.Buffer, done <-chan error, say string) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, what, func() bool {
		select {
		case err := <-done:
			t.Fatalf("waiting for %s, it stopped: %v\n%s", what, err, log.String())
		default:
		}
		return strings.Contains(log.String(), say)
	})
}

// holder reads who holds seat at scope, on a connection of the test's own.
func holder(t *testing.T, r *restartable, seat string, scope claim.Scope) (claim.Record, bool) {
	t.Helper()
	_, js := natstest.Connect(t, r.s)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, ok, err := claim.Current(ctx, js, seat, scope)
	if err != nil {
		return claim.Record{}, false
	}
	return rec, ok
}

// A standalone build agent rides out a bus outage longer than its seat's
// lease: its claim lapses, it says so and tries to claim it again while the
// bus is away, holds its machine's seat again under the same token when the
// server returns (on the same port and store) and pulls again. Before,
// RunAgent returned the lost claim as an error, and build-agent exited 1;
// then it took the seat back under a new token.
func TestAStandaloneAgentRidesOutABusOutageLongerThanItsLease(t *testing.T) {
	bk := testenv.Buildkitd(t)
	srv, _ := raisedRestartable(t)
	var log testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := startAgent(t, ctx, "m1", AgentOptions{NATS: srv.s.ClientURL(), BuildKit: bk,
		Lease: 2 * time.Second, Log: slog.New(slog.NewTextHandler(&log, nil))})
	var before claim.Record
	testenv.WaitFor(t, 30*time.Second, "the agent to claim m1", func() bool {
		var ok bool
		before, ok = holder(t, srv, mesh.BuildSeat, claim.Node("m1"))
		return ok
	})

	srv.stop()
	awaitLog(t, "the agent to say its claim lapsed and it claims it again", &log, done, "the claim lapsed: claiming it again under its own token")
	// Out for longer than the lease, twice over.
	select {
	case err := <-done:
		t.Fatalf("the agent stopped during the outage: %v\n%s", err, log.String())
	case <-time.After(4 * time.Second):
	}
	srv.start()
	testenv.WaitFor(t, 30*time.Second, "the agent to hold m1 again", func() bool {
		rec, ok := holder(t, srv, mesh.BuildSeat, claim.Node("m1"))
		return ok && rec.Token == before.Token && rec.Holder == before.Holder
	})
	_, js := natstest.Connect(t, srv.s)
	testenv.WaitFor(t, 30*time.Second, "the agent to pull again", func() bool {
		c, err := js.Consumer(context.Background(), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.NumWaiting > 0
	})
	select {
	case err := <-done:
		t.Fatalf("the agent stopped: %v", err)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunAgent: %v", err)
	}
}

// deadPid is the pid of a process that ran on this host and has exited.
func deadPid(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

// leaveClaim writes, as a killed predecessor left it, a claim of machine's
// seat held by holder, with a lease the test would notice waiting out.
func leaveClaim(t *testing.T, js jetstream.JetStream, machine, holder string, lease time.Duration) claim.Record {
	t.Helper()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, mesh.ClaimsBucket())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := claim.Record{Seat: mesh.BuildSeat, Scope: mesh.ScopeNode, Node: machine, Holder: holder, Since: now, Renewed: now,
		Lease: lease.String(), Token: "predecessor"}
	data, _ := json.Marshal(rec)
	if _, err := kv.Create(ctx, mesh.ClaimKey(mesh.BuildSeat, machine), data, jetstream.KeyTTL(lease)); err != nil {
		t.Fatal(err)
	}
	return rec
}

// An agent restarted after a kill finds its machine's seat claimed by its
// predecessor: same name, same host, a pid that is no longer running. It
// takes the claim at once, saying whose it was, instead of exiting 1
// naming a dead pid. A claim of a process that does run is still refused.
func TestARestartedAgentTakesTheClaimItsKilledPredecessorLeft(t *testing.T) {
	bk := testenv.Buildkitd(t)
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	if _, err := mesh.Raise(context.Background(), js, meshtest.Catalogue(t, nil), 1); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	dead := deadPid(t)
	stale := leaveClaim(t, js, "m1", "build-agent on "+host+" pid "+strconv.Itoa(dead), time.Minute)

	// A live process holds m2: still refused.
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = live.Process.Kill(); _ = live.Wait() })
	leaveClaim(t, js, "m2", "build-agent on "+host+" pid "+strconv.Itoa(live.Process.Pid), time.Minute)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(machine string, log *testenv.Buffer) <-chan error {
		return startAgent(t, ctx, machine, AgentOptions{NATS: s.ClientURL(), BuildKit: bk, Log: slog.New(slog.NewTextHandler(log, nil))})
	}
	var log1, log2 testenv.Buffer
	start := time.Now()
	m1 := run("m1", &log1)
	testenv.WaitFor(t, 30*time.Second, "the agent to take m1", func() bool {
		rec, ok, _ := claim.Current(ctx, js, mesh.BuildSeat, claim.Node("m1"))
		return ok && rec.Token != stale.Token
	})
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("took m1 after %s: want at once, not the predecessor's lease", took)
	}
	if l := log1.String(); !strings.Contains(l, "left behind") || !strings.Contains(l, "pid "+strconv.Itoa(dead)) {
		t.Errorf("the log does not say whose claim it took:\n%s", l)
	}
	select {
	case err := <-run("m2", &log2):
		if !errors.Is(err, claim.ErrClaimed) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(live.Process.Pid)) {
			t.Fatalf("agent on m2: %v, want refused naming the live holder", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent on m2 was not refused")
	}
	select {
	case err := <-m1:
		t.Fatalf("the agent on m1 stopped: %v", err)
	default:
	}
	cancel()
	if err := <-m1; err != nil {
		t.Fatalf("RunAgent m1: %v", err)
	}
}

// The controller loses its claim of mesh-controller to a bus outage longer
// than its lease, and stands by; when the server returns it takes the
// seat back at once, its own stale claim recognised (the lease it lost),
// not after waiting the claim out.
func TestTheControllerTakesItsSeatBackAtOnceAfterAnOutage(t *testing.T) {
	srv := newRestartable(t)
	dir := chainCatalogue(t)
	var log testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	const lease = 6 * time.Second
	go func() {
		done <- RunController(ctx, ControllerOptions{NATS: srv.s.ClientURL(), Catalogue: dir, Poll: time.Hour, Lease: lease,
			Controller: cascade.Config{Registry: "127.0.0.1:1", Images: testenv.AnyImage{}}, Ready: ready, Log: slog.New(slog.NewTextHandler(&log, nil))})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("controller: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the controller did not start")
	}
	before, ok := holder(t, srv, mesh.ControllerSeat, claim.Mesh())
	if !ok {
		t.Fatal("mesh-controller unclaimed")
	}
	srv.stop()
	testenv.WaitFor(t, 30*time.Second, "the controller to say it lost its claim", func() bool {
		return strings.Contains(log.String(), "lost the seat")
	})
	srv.start()
	back := time.Now()
	testenv.WaitFor(t, 60*time.Second, "the controller to take its seat back", func() bool {
		rec, ok := holder(t, srv, mesh.ControllerSeat, claim.Mesh())
		return ok && rec.Token != before.Token
	})
	took := time.Since(back)
	t.Logf("took the seat back %s after the server returned", took.Round(time.Millisecond))
	if took > lease/2 {
		t.Fatalf("took the seat back %s after the server returned: want at once, not its own stale claim's lease (%s)\n%s", took, lease, log.String())
	}
	select {
	case err := <-done:
		t.Fatalf("the controller stopped: %v", err)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunController: %v", err)
	}
}

// A build in hand goes on through a bus outage longer than the seat's
// lease, and the machine's other slot goes on taking asks: the seat's claim
// lapses, and is claimed again under its own token when the bus is back
// (claim.WithResume); the build runs to its end however long (not its
// stopping grace) and is announced built once (its ask's claim taken
// again: nobody took the ask meanwhile), while a second ask, published
// after the outage, is built on the other slot before it. Before, the lost
// seat stopped the agent as a SIGTERM does (the build cut short after its
// grace, given back and built again); then it kept every idle slot idle
// until the build in hand ended.
func TestABuildInHandGoesOnThroughABusOutageLongerThanTheSeatsLease(t *testing.T) {
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	busybox := testenv.Busybox(t, reg)
	const repo = "https://git.example/outage.git"
	gitDir, commit := testenv.GitRepo(t, map[string]string{
		"app/Dockerfile":   "FROM " + busybox + "\nRUN echo begun && sleep 14 && echo ended\n",
		"quick/Dockerfile": "FROM " + busybox + "\nRUN echo quick\n",
	})
	srv, js := raisedRestartable(t)
	var log testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := startAgent(t, ctx, "m1", AgentOptions{NATS: srv.s.ClientURL(), BuildKit: bk, RegistryClient: registry.NewClient(registry.WithInsecure(true)),
		InsteadOf: map[string]string{repo: gitDir}, Lease: 2 * time.Second, Log: slog.New(slog.NewTextHandler(&log, nil))},
		// A grace far shorter than the outage and the build: the build
		// may not be stopped by it.
		// Every build announces started, the quick one too (the stream's
		// order is read below).
		func(c *agent.Config) { c.Grace, c.Slots, c.StartedDelay = time.Second, 2, 0 })
	testenv.WaitFor(t, 30*time.Second, "the agent to claim m1", func() bool {
		_, ok := holder(t, srv, mesh.BuildSeat, claim.Node("m1"))
		return ok
	})
	seat, _ := holder(t, srv, mesh.BuildSeat, claim.Node("m1"))

	publish := func(js jetstream.JetStream, id, module string) {
		t.Helper()
		a := mesh.Ask{Version: mesh.AskVersion, ID: id, Plan: "p-outage", Module: module,
			Source: mesh.Source{Repo: repo, Commit: commit, Path: module}, Image: reg + "/" + module}
		data, _ := json.Marshal(a)
		if _, err := js.Publish(context.Background(), mesh.BuildSubject(mesh.DefaultPlatform), data, jetstream.WithMsgID(a.ID)); err != nil {
			t.Fatal(err)
		}
	}
	nc := js.Conn()
	logs, err := nc.SubscribeSync(mesh.HolderEventSubject(mesh.BuildSeat, "m1", mesh.LogEvent("outage-1")))
	if err != nil {
		t.Fatal(err)
	}
	publish(js, "outage-1", "app")
	for begun := false; !begun; { // the RUN step running
		msg, err := logs.NextMsg(60 * time.Second)
		if err != nil {
			t.Fatalf("waiting for the build's RUN step: %v\n%s", err, log.String())
		}
		begun = strings.Contains(string(msg.Data), "begun")
	}

	srv.stop()
	awaitLog(t, "the seat's claim to lapse", &log, done, "the claim lapsed: claiming it again under its own token")
	time.Sleep(4 * time.Second) // twice the seat's lease, four times the grace
	srv.start()

	_, js = natstest.Connect(t, srv.s)
	publish(js, "outage-2", "quick")
	type event struct{ ask, event, data string }
	events := func() []event {
		cons, err := js.OrderedConsumer(context.Background(), mesh.EventsStream, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return nil
		}
		var out []event
		for {
			msg, err := cons.Next(jetstream.FetchMaxWait(300 * time.Millisecond))
			if err != nil {
				return out
			}
			_, _, name, _ := mesh.SplitHolderEventSubject(msg.Subject())
			var ev struct{ Ask string }
			_ = json.Unmarshal(msg.Data(), &ev)
			out = append(out, event{ev.Ask, name, string(msg.Data())})
		}
	}
	testenv.WaitFor(t, 60*time.Second, "outage-1 built", func() bool {
		return slices.ContainsFunc(events(), func(e event) bool { return e.ask == "outage-1" && e.event == mesh.EventBuilt })
	})
	var got []string
	for _, e := range events() {
		got = append(got, e.ask+" "+e.event)
		if e.ask == "outage-1" && e.event == mesh.EventBuilt && !strings.Contains(e.data, `"attempt":1`) {
			t.Errorf("outage-1 built at another attempt: %s", e.data)
		}
	}
	want := []string{"outage-1 started", "outage-2 started", "outage-2 built", "outage-1 built"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v: the build in hand built once, the second ask built on the other slot meanwhile\n%s", got, want, log.String())
	}
	if l := log.String(); strings.Contains(l, "stopping: no new asks") || strings.Contains(l, "no new asks; the builds in hand go on") {
		t.Errorf("the lapse stopped the agent's pulling:\n%s", l)
	}
	if rec, ok := holder(t, srv, mesh.BuildSeat, claim.Node("m1")); !ok || rec.Token != seat.Token {
		t.Errorf("m1's seat after the outage: %+v (%v), want the claim it had, %s", rec, ok, seat.Token)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunAgent: %v", err)
	}
}

// A long-running process's connection says on its log that it was lost and
// made again: through an outage nats.go says nothing of either, and an
// agent's log said only what failed for want of the bus.
func TestTheConnectionSaysItWasLostAndMadeAgain(t *testing.T) {
	srv := newRestartable(t)
	var log testenv.Buffer
	nc, _, err := Connect(srv.s.ClientURL(), "", mesh.ControllerPrincipal, "test", Logged(slog.New(slog.NewTextHandler(&log, nil)))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	srv.stop()
	testenv.WaitFor(t, 10*time.Second, "the log to say the connection was lost", func() bool {
		return strings.Contains(log.String(), "lost the connection to NATS; reconnecting")
	})
	srv.start()
	testenv.WaitFor(t, 30*time.Second, "the log to say it reconnected", func() bool {
		return strings.Contains(log.String(), "reconnected to NATS") && strings.Contains(log.String(), "after=")
	})
	if strings.Contains(log.String(), "closed") {
		t.Errorf("the log says the connection closed:\n%s", log.String())
	}
}

// A controller started while its cluster cannot answer JetStream (two of
// three servers down, as while a cluster started again whole elects its
// leaders) waits for it, saying so, instead of stopping on its first
// request; it starts once the servers are back. (By hand: a farm of three
// servers killed with kill -9 and started again stopped with "asserting
// bucket CLAIMS: context deadline exceeded".)
func TestAControllerStartedBeforeItsClusterAnswersWaitsForIt(t *testing.T) {
	bus := natstest.Cluster(t, 3)
	bus.Stop(1)
	bus.Stop(2)
	var log testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- RunController(ctx, ControllerOptions{NATS: bus.URLs(), Catalogue: chainCatalogue(t), Poll: time.Hour,
			Controller: cascade.Config{Registry: "127.0.0.1:1", Images: testenv.AnyImage{}, Replicas: 3},
			Ready:      ready, Log: slog.New(slog.NewTextHandler(&log, nil))})
	}()
	testenv.WaitFor(t, 30*time.Second, "the controller to say the bus does not answer", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the controller stopped while its cluster could not answer: %v", err)
		default:
		}
		return strings.Contains(log.String(), "the bus did not answer; retrying")
	})
	bus.Restart(1)
	bus.Restart(2)
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("controller: %v\n%s", err, log.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("the controller did not start once its cluster was back\n%s", log.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunController: %v", err)
	}
}

// A NATS server started again on an empty store (its disk lost, or
// replaced) has none of the farm's streams: the controller's work failed
// with them and it exited, taking `builds up` down, while the machines
// pulled from queues that no longer existed. Now the controller says the
// bus lost them, raises the wire again, holds its seat anew and plans again
// the plan it was running, and the machine takes its seat and pulls from
// its queue again, with no restart of either process.
func TestAControllerAndAMachineStartOverOnABusThatLostItsStore(t *testing.T) {
	bk := testenv.Buildkitd(t)
	srv := newRestartable(t)
	dir := chainCatalogue(t)
	var alog testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctl := startStandbyController(t, srv.s.ClientURL(), dir, 6*time.Second)
	ctl.awaitReady(t, 60*time.Second)
	adone := startAgent(t, ctx, "m1", AgentOptions{NATS: srv.s.ClientURL(), BuildKit: bk, Catalogue: dir,
		Lease: 2 * time.Second, Log: slog.New(slog.NewTextHandler(&alog, nil))})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller:\n%s\nagent:\n%s", ctl.log.String(), alog.String())
		}
	})
	// The test's own connection, which rides out the restart.
	_, js := natstest.Connect(t, srv.s, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	pulling := func() bool {
		c, err := js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
		if err != nil {
			return false
		}
		// A pull waiting, or an ask taken (the plan planned again).
		info, err := c.Info(ctx)
		return err == nil && (info.NumWaiting > 0 || info.Delivered.Consumer > 0)
	}
	held := func(seat string, scope claim.Scope) bool {
		_, ok, err := claim.Current(ctx, js, seat, scope)
		return err == nil && ok
	}
	testenv.WaitFor(t, 30*time.Second, "m1 holding its seat and pulling", func() bool {
		return held(mesh.BuildSeat, claim.Node("m1")) && pulling()
	})
	// A plan in flight: its repository cannot be fetched here, so it stays
	// running, its first ask retried.
	planned := func() bool {
		st, err := cascade.OpenStore(ctx, js, "build-controller")
		if err != nil {
			return false
		}
		rec, err := st.Plan(ctx, planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: meshtest.FleetRepo, Commit: "c1"}))
		return err == nil && rec.Outcome == cascade.OutcomeRunning
	}
	data, _ := json.Marshal(mesh.Pushed{Version: 1, Repo: meshtest.FleetRepo, Commit: "c1", At: time.Now().UTC()})
	if _, err := js.Publish(ctx, mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the push planned", planned)

	srv.stop()
	if err := os.RemoveAll(srv.opts.StoreDir); err != nil {
		t.Fatal(err)
	}
	srv.start()
	testenv.WaitFor(t, 90*time.Second, "the controller holding its seat again on the emptied server, the wire raised again, m1 holding its seat and pulling", func() bool {
		select {
		case err := <-ctl.done:
			t.Fatalf("the controller stopped: %v\n%s", err, ctl.log.String())
		case err := <-adone:
			t.Fatalf("the agent stopped: %v\n%s", err, alog.String())
		default:
		}
		return held(mesh.ControllerSeat, claim.Mesh()) && held(mesh.BuildSeat, claim.Node("m1")) && pulling()
	})
	testenv.WaitFor(t, 30*time.Second, "the plan in flight planned again", planned)
	if _, err := js.Stream(ctx, mesh.EventsStream); err != nil {
		t.Errorf("EVENTS after the restart: %v", err)
	}
	ctl.stop()
	cancel()
	if err := <-ctl.done; err != nil {
		t.Errorf("RunController: %v", err)
	}
	if err := <-adone; err != nil {
		t.Errorf("RunAgent: %v", err)
	}
}
