package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
	seats "github.com/meshbuild/meshbuild/seat"
)

// proxy stands between one process and the bus; cut partitions it: every
// connection through it drops and no new one gets through.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// gatedWork builds instantly, except a module whose gate is set: its build
// starts (said on started) and waits for the gate to close. It counts every
// build by module.
type gatedWork struct {
	mu      sync.Mutex
	builds  map[string]int
	gates   map[string]chan struct{}
	started chan string
}

func (w *gatedWork) Work(ctx context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
	w.mu.Lock()
	w.builds[a.Module]++
	gate := w.gates[a.Module]
	w.mu.Unlock()
	w.started <- a.Module
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return agent.Result{}, context.Cause(ctx)
		}
	}
	h := sha256.Sum256([]byte(a.ID))
	dg := "sha256:" + hex.EncodeToString(h[:])
	return agent.Result{Digest: dg, Ref: a.Image + "@" + dg}, nil
}

// chainCatalogue writes the farm's own manifests and a chain of built
// modules a ← b ← c to a catalogue directory.
func chainCatalogue(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"a.yaml": "module: a\nbuild:\n  repo: " + meshtest.FleetRepo + "\n  path: a\n",
		"b.yaml": "module: b\nbuild:\n  repo: " + meshtest.FleetRepo + "\n  path: b\n  on: [a]\n",
		"c.yaml": "module: c\nbuild:\n  repo: " + meshtest.FleetRepo + "\n  path: c\n  on: [b]\n",
	}
	for _, m := range meshtest.MeshModules {
		data, err := os.ReadFile(filepath.Join(root, "examples/fleet/catalogue", m+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		files[m+".yaml"] = string(data)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// builtEvents counts the built events in EVENTS by module: what the bus
// saw, not what the controller recorded.
func builtEvents(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, mesh.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventBuilt)},
	})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for range info.NumPending {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var ev mesh.Built
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		out[ev.Module]++
	}
	return out
}

// standbyController is a build-controller (RunController) of a test that
// makes two of one catalogue contend for mesh-controller: its log, Ready,
// how it ended, and stop.
type standbyController struct {
	log   testenv.Buffer
	ready chan struct{}
	done  chan error
	stop  context.CancelFunc
}

// startStandbyController runs a controller of the catalogue in dir with
// lease on url until the test ends or stop; tweaks change its options.
func startStandbyController(t *testing.T, url, dir string, lease time.Duration, tweaks ...func(*ControllerOptions)) *standbyController {
	t.Helper()
	c := &standbyController{ready: make(chan struct{}), done: make(chan error, 1)}
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	t.Cleanup(stop)
	o := ControllerOptions{NATS: url, Catalogue: dir, Poll: time.Hour, Lease: lease,
		Controller: cascade.Config{Registry: "127.0.0.1:1", Images: testenv.AnyImage{}}, Ready: c.ready,
		Log: slog.New(slog.NewTextHandler(&c.log, nil))}
	for _, tweak := range tweaks {
		tweak(&o)
	}
	go func() { c.done <- RunController(ctx, o) }()
	return c
}

// awaitReady waits, within, for the controller to serve; its stopping
// first fails t.
func (c *standbyController) awaitReady(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-c.ready:
	case err := <-c.done:
		t.Fatalf("controller: %v\n%s", err, c.log.String())
	case <-time.After(within):
		t.Fatalf("the controller did not start within %s\n%s", within, c.log.String())
	}
}

// Two controllers on one bus: the second stands by (saying so, and who
// holds the seat since when) and consumes nothing. The first is cut from
// the bus mid-plan; the standby takes over within the lease, resumes the
// plan from KV and finishes it, each module built exactly once.
func TestAStandbyControllerTakesOverMidPlan(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	dir := chainCatalogue(t)
	const lease = time.Second

	// A reaches the bus through a proxy the test can cut.
	px := newProxy(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	a := startStandbyController(t, px.url(), dir, lease)
	select {
	case <-a.ready:
	case err := <-a.done:
		t.Fatalf("controller A: %v", err)
	}
	b := startStandbyController(t, s.ClientURL(), dir, lease)
	holderA, ok, err := claim.Current(context.Background(), js, mesh.ControllerSeat, claim.Mesh())
	if err != nil || !ok {
		t.Fatalf("mesh-controller unclaimed with A running: %v", err)
	}
	testenv.WaitFor(t, 10*time.Second, "B to say it stands by, naming A", func() bool {
		l := b.log.String()
		return strings.Contains(l, "standby") && strings.Contains(l, holderA.Holder) &&
			strings.Contains(l, holderA.Since.Format(time.RFC3339))
	})

	// An agent (its own connection), with b's build held open.
	work := &gatedWork{builds: map[string]int{}, gates: map[string]chan struct{}{"b": make(chan struct{})}, started: make(chan string, 8)}
	_, ajs := natstest.Connect(t, s)
	cfg := agent.DefaultConfig()
	cfg.Machine, cfg.FetchWait = "m1", 200*time.Millisecond
	ag, err := agent.New(cfg, ajs, work, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	actx, stopAgent := context.WithCancel(context.Background())
	agentDone := make(chan struct{})
	go func() { defer close(agentDone); _ = ag.Run(actx) }()
	defer func() { stopAgent(); <-agentDone }()

	ev := mesh.Pushed{Version: 1, Repo: meshtest.FleetRepo, Commit: "c1", At: time.Now().UTC()}
	data, _ := json.Marshal(ev)
	plan := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: meshtest.FleetRepo, Commit: "c1"})
	if _, err := js.Publish(context.Background(), mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID(plan)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a", "b"} {
		select {
		case got := <-work.started:
			if got != want {
				t.Fatalf("built %s, want %s", got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s never started", want)
		}
	}
	// Only A worked so far: B consumed nothing.
	if l := b.log.String(); strings.Contains(l, "controller running") || strings.Contains(l, "plan=") {
		t.Fatalf("the standby worked while A held the seat:\n%s", l)
	}
	if !strings.Contains(a.log.String(), "plan="+plan) {
		t.Fatalf("A did not plan the push:\n%s", a.log.String())
	}

	// A is cut off mid-plan, b still building.
	cut := time.Now()
	px.cut()
	select {
	case <-b.ready:
	case err := <-b.done:
		t.Fatalf("controller B: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("the standby did not take over:\n%s", b.log.String())
	}
	took := time.Since(cut)
	// A gave the seat up before B could take it: never two holders.
	if !strings.Contains(a.log.String(), "lost the seat") {
		t.Errorf("B took over before A gave the seat up:\n%s", a.log.String())
	}
	t.Logf("standby took over %s after the holder was cut off (lease %s)", took, lease)
	if took > 3*lease+time.Second {
		t.Errorf("takeover took %s with a lease of %s", took, lease)
	}
	// b finishes now. (Had it finished while the server still kept A's
	// pull requests, its built would have gone to A and come back to B
	// after the consumer's ack wait: later, never lost.)
	close(work.gates["b"])
	store, err := cascade.OpenStore(context.Background(), js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the standby to finish the plan", func() bool {
		rec, err := store.Plan(context.Background(), plan)
		return err == nil && rec.Outcome == cascade.OutcomeBuilt
	})
	if got := builtEvents(t, js); got["a"] != 1 || got["b"] != 1 || got["c"] != 1 || len(got) != 3 {
		t.Fatalf("built events by module %v: want each of a, b, c exactly once", got)
	}
	work.mu.Lock()
	builds := work.builds
	work.mu.Unlock()
	if builds["a"] != 1 || builds["b"] != 1 || builds["c"] != 1 {
		t.Fatalf("builds by module %v: want each once", builds)
	}
	if now, _, _ := claim.Current(context.Background(), js, mesh.ControllerSeat, claim.Mesh()); now.Holder == holderA.Holder && now.Token == holderA.Token {
		t.Fatal("the seat is still A's claim")
	}
	// A, cut off, stands by again rather than exiting or working.
	select {
	case err := <-a.done:
		t.Fatalf("A stopped instead of standing by: %v", err)
	default:
	}
	a.stop()
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		t.Fatal("A did not stop")
	}
	b.stop()
	if err := <-b.done; err != nil {
		t.Fatalf("controller B: %v", err)
	}
	if rec, ok, _ := claim.Current(context.Background(), js, mesh.ControllerSeat, claim.Mesh()); ok {
		t.Fatalf("a stopped controller left its claim: %+v", rec)
	}
}

// A second build agent started with a machine's name is refused, naming the
// agent that holds the machine's seat and since when; another machine's
// starts.
func TestTwoAgentsOnOneMachineAreRefused(t *testing.T) {
	bk := testenv.Buildkitd(t)
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	if _, err := mesh.Raise(context.Background(), js, meshtest.Catalogue(t, nil), 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(machine string) <-chan error {
		return startAgent(t, ctx, machine, AgentOptions{NATS: s.ClientURL(), BuildKit: bk, Lease: time.Second})
	}
	holds := func(machine string) claim.Record {
		var rec claim.Record
		testenv.WaitFor(t, 30*time.Second, "an agent to claim "+machine, func() bool {
			r, ok, _ := claim.Current(ctx, js, mesh.BuildSeat, claim.Node(machine))
			rec = r
			return ok
		})
		return rec
	}
	first := run("m1")
	rec := holds("m1")

	select {
	case err := <-run("m1"):
		var ce *claim.ClaimedError
		if !errors.Is(err, claim.ErrClaimed) || !errors.As(err, &ce) || ce.Record.Holder != rec.Holder {
			t.Fatalf("second agent on m1: %v, want ErrClaimed naming %q", err, rec.Holder)
		}
		t.Logf("refused: %v", err)
		for _, want := range []string{`"m1"`, rec.Holder, rec.Since.Format(time.RFC3339), "--machine"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal %q does not say %q", err, want)
			}
		}
	case err := <-first:
		t.Fatalf("the first agent stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the second agent on m1 was not refused")
	}
	second := run("m2")
	holds("m2")
	cancel()
	for _, c := range []<-chan error{first, second} {
		if err := <-c; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
	// Both stopped and let go of their machines' seats.
	for _, m := range []string{"m1", "m2"} {
		if rec, ok, _ := claim.Current(context.Background(), js, mesh.BuildSeat, claim.Node(m)); ok {
			t.Errorf("%s still claimed after its agent stopped: %+v", m, rec)
		}
	}
}

// A controller cut off with its connection open — a network that drops
// everything, or its process stopped with SIGSTOP, as the server sees
// either — leaves its last pulls at the server until they expire, and an
// event delivered to one waits the consumer's ack wait (30 s). Its pulls
// last a third of its lease (seats.PullForLease), so they are gone by the
// time its claim lapses and the standby takes over: a push published the
// moment the standby holds the seat is planned at once. With 10 s pulls
// and this lease of 3 s, such a push went to the stopped controller's pull
// and the plan was made half a minute late.
func TestAStandbyTakingOverFromAFrozenControllerIsDeliveredWhatFollows(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	dir := chainCatalogue(t)
	const lease = 3 * time.Second
	fz := testenv.Freeze(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	a := startStandbyController(t, "nats://"+fz.Addr(), dir, lease)
	select {
	case <-a.ready:
	case err := <-a.done:
		t.Fatalf("controller A: %v", err)
	}
	b := startStandbyController(t, s.ClientURL(), dir, lease)
	testenv.WaitFor(t, 10*time.Second, "B to stand by", func() bool { return strings.Contains(b.log.String(), "standby") })

	fz.Freeze()
	frozen := time.Now()
	select {
	case <-b.ready:
	case err := <-b.done:
		t.Fatalf("controller B: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatalf("the standby did not take over:\n%s", b.log.String())
	}
	t.Logf("B took over %s after A froze", time.Since(frozen).Round(time.Millisecond))
	ev := mesh.Pushed{Version: 1, Repo: meshtest.FleetRepo, Commit: "c1", At: time.Now().UTC()}
	data, _ := json.Marshal(ev)
	plan := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: meshtest.FleetRepo, Commit: "c1"})
	published := time.Now()
	if _, err := js.Publish(context.Background(), mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID(plan)); err != nil {
		t.Fatal(err)
	}
	store, err := cascade.OpenStore(context.Background(), js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the standby to plan the push published as it took over (the events' ack wait is "+mesh.ConsumerAckWait.String()+")", func() bool {
		_, err := store.Plan(context.Background(), plan)
		return err == nil
	})
	t.Logf("planned %s after the push", time.Since(published).Round(time.Millisecond))
	fz.Thaw()
	a.stop()
	b.stop()
	for i, c := range []*standbyController{a, b} {
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
			t.Fatalf("controller %c did not stop:\n%s", 'A'+i, c.log.String())
		}
	}
}

// PullForLease: a third of the lease, at most the default 10 s, at least
// the 1 s nats.go takes; the default lease's is 5 s.
func TestPullForLease(t *testing.T) {
	for _, c := range []struct{ lease, want time.Duration }{
		{0, claim.DefaultLease / 3}, {3 * time.Second, time.Second}, {time.Second, time.Second},
		{15 * time.Second, 5 * time.Second}, {time.Minute, 10 * time.Second},
	} {
		if got := seats.PullForLease(c.lease); got != c.want {
			t.Errorf("PullForLease(%s) = %s, want %s", c.lease, got, c.want)
		}
	}
}
