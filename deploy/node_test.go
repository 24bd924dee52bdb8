package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

func assign(t *testing.T, b *bed, tool, module string, nodes ...string) {
	t.Helper()
	if _, err := b.call(tool, deploy.Request{Module: module, Nodes: nodes}); err != nil {
		t.Fatal(err)
	}
}

// TestStaleDeclarationIsRefused: a declaration replayed after a newer one
// was applied (n−1 after n) is refused, not applied; the node reports the
// refusal, and the controller settles that report as superseded.
func TestStaleDeclarationIsRefused(t *testing.T) {
	b := newBed(t, []string{"n1"})
	cm, _ := b.controller(deploy.DefaultControllerConfig())
	n, nm := b.node("n1", t.TempDir(), nil)
	run(b.ctx, n.Run)
	testenv.WaitFor(t, 10*time.Second, "n1 to enrol", func() bool { _, ok := b.nodes()["n1"]; return ok })
	assign(t, b, mesh.AssignTool, "base", "n1")
	first, _ := b.lastDeclaration("n1")
	assign(t, b, mesh.AssignTool, "app", "n1")
	testenv.WaitFor(t, 10*time.Second, "n1 to apply revision 2", func() bool { return n.Applied() == 2 })

	data, _ := json.Marshal(first)
	if _, err := b.ajs.Publish(b.ctx, mesh.NodeSubject("n1"), data); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the replayed revision 1 to be refused and its report settled as superseded", func() bool {
		return count(nm.Applies(deploy.Refused)) == 1 && count(cm.Reports(deploy.Refused, "superseded")) == 1
	})
	if n.Applied() != 2 {
		t.Fatalf("applied %d after a stale declaration, want 2", n.Applied())
	}
	if v := b.nodes()["n1"]; v.Outcome != deploy.Applied || v.Applied != 2 {
		t.Fatalf("the superseded report was acted on: %+v", v)
	}
	// The refusal survives a restart: the applied revision is kept on disk.
	n2, _ := b.node("n1", n.StateDir(), nil)
	if n2.Applied() != 2 || n2.Identity() != n.Identity() {
		t.Fatalf("a restarted node has applied %d as %s", n2.Applied(), n2.Identity())
	}
	b.noViolations()
}

// A bus that lost its store (every stream gone; the fleet's controller
// started over on the wire raised again) no longer knows the node. Before,
// the node pulled from its gone consumer for ever, unlisted, and a module
// assigned after was declared at revision 1, which it refused as stale.
// Now it enrols again, saying the revision it applied, keeps what it runs,
// and applies what is assigned after.
func TestANodeEnrolsAgainOnABusThatLostItsStore(t *testing.T) {
	b := newBed(t, []string{"n1"})
	_, c := b.controller(deploy.DefaultControllerConfig())
	n, nm := b.node("n1", t.TempDir(), nil)
	run(b.ctx, n.Run)
	testenv.WaitFor(t, 10*time.Second, "n1 to enrol", func() bool { _, ok := b.nodes()["n1"]; return ok })
	assign(t, b, mesh.AssignTool, "base", "n1")
	assign(t, b, mesh.AssignTool, "app", "n1")
	testenv.WaitFor(t, 10*time.Second, "n1 to apply revision 2", func() bool { return n.Applied() == 2 })

	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	var streams []string
	for name := range b.ajs.StreamNames(b.ctx).Name() {
		streams = append(streams, name)
	}
	for _, name := range streams {
		if err := b.ajs.DeleteStream(b.ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	b.controller(deploy.DefaultControllerConfig()) // raises the wire again
	testenv.WaitFor(t, 45*time.Second, "n1 to enrol again", func() bool { _, ok := b.nodes()["n1"]; return ok })
	assign(t, b, mesh.AssignTool, "base", "n1")
	d, ok := b.lastDeclaration("n1")
	if !ok || d.Revision != 3 {
		t.Fatalf("n1's declaration after the store was lost: %+v (%v), want revision 3, above the 2 it applied", d, ok)
	}
	testenv.WaitFor(t, 10*time.Second, "n1 to apply revision 3", func() bool { return n.Applied() == 3 })
	if r := count(nm.Applies(deploy.Refused)); r != 0 {
		t.Errorf("n1 refused %v declarations", r)
	}
	b.noViolations()
}

// TestNodeAwayGetsOnlyTheCurrentDeclaration: declarations composed while a
// node is away are not queued; it reads exactly the newest.
func TestNodeAwayGetsOnlyTheCurrentDeclaration(t *testing.T) {
	b := newBed(t, []string{"n1"})
	b.controller(deploy.DefaultControllerConfig())
	n, nm := b.node("n1", t.TempDir(), nil)
	if err := n.Enrol(b.ctx); err != nil {
		t.Fatal(err)
	}
	assign(t, b, mesh.AssignTool, "base", "n1")
	assign(t, b, mesh.AssignTool, "app", "n1")
	assign(t, b, mesh.UnassignTool, "base", "n1")
	st, _ := b.ajs.Stream(b.ctx, mesh.NodesStream)
	info, _ := st.Info(b.ctx)
	if info.State.Msgs != 1 {
		t.Fatalf("the stream keeps %d declarations for n1, want the last one only", info.State.Msgs)
	}
	run(b.ctx, n.Run)
	testenv.WaitFor(t, 10*time.Second, "n1 to apply revision 3 and count it", func() bool { return n.Applied() == 3 && count(nm.Applies(deploy.Applied)) >= 1 })
	if a, r := count(nm.Applies(deploy.Applied)), count(nm.Applies(deploy.Refused)); a != 1 || r != 0 {
		t.Fatalf("n1 applied %v and refused %v declarations, want exactly the current one", a, r)
	}
	b.noViolations()
}

// A node killed with its declaration in hand (fetched, not acknowledged)
// and started again applies it at once, on its own credentials on an
// enforcing server: its consumer delivers one declaration at a time, so
// before, the new process waited out the ack wait (five minutes) for that
// one and any newer.
func TestANodeStartedAgainTakesTheDeclarationItsKilledPredecessorHad(t *testing.T) {
	b := newBed(t, []string{"n1"})
	b.controller(deploy.DefaultControllerConfig())
	n, _ := b.node("n1", t.TempDir(), nil)
	if err := n.Enrol(b.ctx); err != nil {
		t.Fatal(err)
	}
	assign(t, b, mesh.AssignTool, "base", "n1")
	// The predecessor, as n1: it fetched the declaration and was killed.
	pnc, pjs := b.connect("n1", nil)
	cons, err := pjs.Consumer(b.ctx, mesh.NodesStream, mesh.NodeConsumer("n1"))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for range batch.Messages() {
		got++
	}
	if got != 1 {
		t.Fatalf("the predecessor fetched %d declarations, want 1", got)
	}
	pnc.Close()

	start := time.Now()
	run(b.ctx, n.Run)
	testenv.WaitFor(t, 20*time.Second, "the node started again to apply the declaration its predecessor had (the ack wait is "+mesh.NodeAckWait.String()+")",
		func() bool { return n.Applied() == 1 })
	t.Logf("applied %s after the node started again", time.Since(start).Round(time.Millisecond))
	// And the next one, through the same consumer.
	assign(t, b, mesh.AssignTool, "app", "n1")
	testenv.WaitFor(t, 10*time.Second, "the next declaration", func() bool { return n.Applied() == 2 })
	b.noViolations()
}

// TestNodePermissionsReachItsOwnConsumerOnly sets the node's consumer
// against the grant the node actually gets, on an enforcing server, with
// each of ADR 0121's three silent mistakes.
func TestNodePermissionsReachItsOwnConsumerOnly(t *testing.T) {
	// A principal whose grants were written for a consumer named "x":
	// it may look the consumer up and fetch from it, but its ack grant is
	// derived from its node name.
	misnamed := mesh.NodePermissions("n1")
	misnamed.Principal = "misnamed"
	misnamed.Publish = append(misnamed.Publish, "$JS.API.CONSUMER.INFO.NODES.x", "$JS.API.CONSUMER.MSG.NEXT.NODES.x")
	misnamed.Subscribe = append(misnamed.Subscribe, mesh.InboxPrefix("misnamed")+".>")
	b := newBed(t, []string{"n1", "n2"}, misnamed)
	b.controller(deploy.DefaultControllerConfig())
	declare := func(node string, rev uint64) {
		data, _ := json.Marshal(deploy.Declaration{Version: 1, Node: node, Revision: rev})
		if _, err := b.ajs.Publish(b.ctx, mesh.NodeSubject(node), data); err != nil {
			t.Fatal(err)
		}
	}
	fetchOne := func(js jetstream.JetStream, consumer string) (jetstream.Msg, error) {
		cons, err := js.Consumer(b.ctx, mesh.NodesStream, consumer)
		if err != nil {
			return nil, err
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, err
		}
		for m := range batch.Messages() {
			return m, nil
		}
		return nil, errors.New("nothing delivered")
	}
	declare("n1", 1)
	declare("n2", 1)

	// 1. A consumer named otherwise cannot be acknowledged.
	spec := mesh.NodeConsumerSpec("n1", 1)
	spec.Config.Durable = "x"
	if _, err := b.ajs.CreateOrUpdateConsumer(b.ctx, mesh.NodesStream, spec.Config); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	_, mjs := b.connect("misnamed", errs)
	m, err := fetchOne(mjs, "x")
	if err != nil {
		t.Fatalf("fetching from the misnamed consumer: %v", err)
	}
	_ = m.Ack()
	select {
	case err := <-errs:
		t.Logf("the ack was refused, as it must be: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("an ack on a consumer not named after the node was not refused")
	}
	x, _ := b.ajs.Consumer(b.ctx, mesh.NodesStream, "x")
	if info, _ := x.Info(b.ctx); info.NumAckPending != 1 {
		t.Fatalf("the misnamed consumer's delivery was settled: %+v", info)
	}

	// 2. A wrong filter reads another node's declarations; the derived one
	// only the node's own.
	wrong := mesh.NodeConsumerSpec("n1", 1).Config
	wrong.FilterSubject = mesh.NodeSubject("n2")
	if _, err := b.ajs.CreateOrUpdateConsumer(b.ctx, mesh.NodesStream, wrong); err != nil {
		t.Fatal(err)
	}
	_, n1js := b.connect("n1", nil)
	m, err = fetchOne(n1js, "n1")
	if err != nil || m.Subject() != mesh.NodeSubject("n2") {
		t.Fatalf("the wrong filter should have delivered n2's declaration to n1: %v", err)
	}
	_ = b.ajs.DeleteConsumer(b.ctx, mesh.NodesStream, "n1")
	// The name made again at once: the server removes the deleted
	// consumer's directory after it answers, and a create under the same
	// name was seen failing meanwhile (CI: "code=500 err_code=10012 rename
	// …/obs/n1/o.dat.tmp …/obs/n1/o.dat: no such file or directory"). The
	// farm never reuses a consumer's name so; the test asks again.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := b.ajs.CreateOrUpdateConsumer(b.ctx, mesh.NodesStream, mesh.NodeConsumerSpec("n1", 1).Config)
		var apiErr *jetstream.APIError
		if err != nil && errors.As(err, &apiErr) && apiErr.Code == 500 && time.Now().Before(deadline) {
			t.Logf("the consumer made again under its deleted name: %v; asking again", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	m, err = fetchOne(n1js, "n1")
	if err != nil || m.Subject() != mesh.NodeSubject("n1") {
		t.Fatalf("the derived consumer delivered %v (%v), want n1's own declaration", m, err)
	}
	if err := m.DoubleAck(b.ctx); err != nil {
		t.Fatalf("n1 acknowledging its own declaration: %v", err)
	}

	// 3. The node cannot bind, create or write what it has no grant for.
	if _, err := b.ajs.CreateOrUpdateConsumer(b.ctx, mesh.NodesStream, mesh.NodeConsumerSpec("n2", 1).Config); err != nil {
		t.Fatal(err)
	}
	nerrs := make(chan error, 8)
	_, n1strict := b.connect("n1", nerrs)
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	if _, err := n1strict.Consumer(ctx, mesh.NodesStream, "n2"); err == nil {
		t.Fatal("n1 bound n2's consumer")
	}
	if _, err := n1strict.CreateOrUpdateConsumer(ctx, mesh.NodesStream, jetstream.ConsumerConfig{Durable: "n1b", FilterSubject: mesh.NodeSubject("n2")}); err == nil {
		t.Fatal("n1 created a consumer")
	}
	if _, err := n1strict.Publish(ctx, mesh.NodeSubject("n1"), []byte("{}")); err == nil {
		t.Fatal("n1 wrote a declaration")
	}
	select {
	case <-nerrs:
	case <-time.After(5 * time.Second):
		t.Fatal("the server reported no violation for n1's attempts")
	}
}

// TestStoreWindow checks the controller's store window against a running
// server, with a real outage of its store (the bucket's stream deleted and
// raised again).
func TestStoreWindow(t *testing.T) {
	report := func(b *bed, kind string, rev uint64) {
		t.Helper()
		data, _ := json.Marshal(deploy.Report{Version: 1, Kind: kind, Node: "n1", Revision: rev, Applied: rev, At: time.Now().UTC()})
		if _, err := b.ajs.Publish(b.ctx, mesh.SeatAcceptSubject(mesh.ControllerSeat, mesh.ReportVerb), data); err != nil {
			t.Fatal(err)
		}
	}
	status := func(b *bed) (uint64, bool) {
		kv, err := b.ajs.KeyValue(b.ctx, mesh.KVBucket("build-controller", deploy.StateBucket))
		if err != nil {
			return 0, false
		}
		e, err := kv.Get(b.ctx, deploy.StatusKey("n1"))
		if err != nil {
			return 0, false
		}
		var s deploy.Status
		_ = json.Unmarshal(e.Value(), &s)
		return s.Revision, true
	}
	setup := func(t *testing.T, cfg deploy.ControllerConfig) (*bed, *deploy.Metrics) {
		b := newBed(t, []string{"n1"})
		m, _ := b.controller(cfg)
		n, _ := b.node("n1", t.TempDir(), nil)
		if err := n.Enrol(b.ctx); err != nil {
			t.Fatal(err)
		}
		return b, m
	}
	outage := func(b *bed) {
		if err := b.ajs.DeleteKeyValue(b.ctx, mesh.KVBucket("build-controller", deploy.StateBucket)); err != nil {
			t.Fatal(err)
		}
	}
	recover := func(b *bed) {
		if _, err := mesh.Raise(b.ctx, b.ajs, b.cat, 1); err != nil {
			t.Fatal(err)
		}
	}
	cfg := deploy.DefaultControllerConfig()
	cfg.ReportDelay = 200 * time.Millisecond

	t.Run("heard and leaves the queue", func(t *testing.T) {
		b, m := setup(t, cfg)
		report(b, deploy.Applied, 1)
		testenv.WaitFor(t, 10*time.Second, "the report to be recorded", func() bool { _, ok := status(b); return ok })
		testenv.WaitFor(t, 10*time.Second, "the queue to be empty", func() bool { return b.seatMsgs() == 0 })
		if count(m.Reports(deploy.Applied, "recorded")) != 1 {
			t.Fatal("not counted as recorded")
		}
	})
	t.Run("held while the store is away, recorded when it returns", func(t *testing.T) {
		b, m := setup(t, cfg)
		outage(b)
		report(b, deploy.Failed, 1)
		testenv.WaitFor(t, 10*time.Second, "the report to be held twice", func() bool {
			return count(m.Reports(deploy.Failed, "held")) >= 2
		})
		if b.seatMsgs() != 1 {
			t.Fatalf("a held report is not in the stream: %d messages", b.seatMsgs())
		}
		recover(b)
		testenv.WaitFor(t, 10*time.Second, "the held report to be recorded", func() bool { _, ok := status(b); return ok })
		testenv.WaitFor(t, 10*time.Second, "the queue to be empty", func() bool { return b.seatMsgs() == 0 })
	})
	t.Run("superseded is settled without action", func(t *testing.T) {
		b, m := setup(t, cfg)
		assign(t, b, mesh.AssignTool, "base", "n1")
		assign(t, b, mesh.AssignTool, "app", "n1")
		report(b, deploy.Applied, 1)
		testenv.WaitFor(t, 10*time.Second, "the report to be settled", func() bool {
			return count(m.Reports(deploy.Applied, "superseded")) == 1 && b.seatMsgs() == 0
		})
		if _, ok := status(b); ok {
			t.Fatal("a superseded report was recorded")
		}
	})
	t.Run("let go after the bound", func(t *testing.T) {
		bound := cfg
		bound.ReportBound = time.Second
		b, m := setup(t, bound)
		outage(b)
		report(b, deploy.Applied, 1)
		testenv.WaitFor(t, 10*time.Second, "the report to be let go", func() bool {
			return count(m.Reports(deploy.Applied, "let-go")) == 1 && b.seatMsgs() == 0
		})
		recover(b)
		if _, ok := status(b); ok {
			t.Fatal("a report let go was recorded")
		}
	})
	t.Run("a heartbeat is heard and nothing persisted", func(t *testing.T) {
		b, m := setup(t, cfg)
		lastSeq := func() uint64 {
			st, err := b.ajs.Stream(b.ctx, mesh.KVStream(mesh.KVBucket("build-controller", deploy.StateBucket)))
			if err != nil {
				t.Fatal(err)
			}
			info, _ := st.Info(b.ctx)
			return info.State.LastSeq
		}
		before := lastSeq()
		report(b, deploy.Heartbeat, 0)
		report(b, deploy.Heartbeat, 0)
		testenv.WaitFor(t, 10*time.Second, "two heartbeats heard", func() bool {
			return count(m.Reports(deploy.Heartbeat, "heard")) == 2 && b.seatMsgs() == 0
		})
		if after := lastSeq(); after != before {
			t.Fatalf("a heartbeat wrote to the store: last sequence %d, was %d", after, before)
		}
		if v := b.nodes()["n1"]; !v.Online || v.Heartbeat.IsZero() {
			t.Fatalf("heartbeat not heard: %+v", v)
		}
	})
}

// holdWorker stands in for BuildKit: on one node it holds an ask until it is
// stopped, on the other it builds at once.
type holdWorker struct {
	hold    bool
	mu      sync.Mutex
	started chan string
	built   []string
}

func (w *holdWorker) Work(ctx context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
	if w.hold {
		w.started <- a.ID
		<-ctx.Done()
		return agent.Result{}, context.Cause(ctx)
	}
	w.mu.Lock()
	w.built = append(w.built, a.ID)
	w.mu.Unlock()
	d := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	return agent.Result{Digest: d, Ref: a.Image + "@" + d}, nil
}

func (w *holdWorker) builtAsks() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.built...)
}

// TestUnassignedBuildAgentHandsBack: build-agent is a module the node
// carries; unassigned, it stops and hands back the ask it holds, and the
// build agent of another node builds it.
func TestUnassignedBuildAgentHandsBack(t *testing.T) {
	cat := meshtest.Catalogue(t, nil)
	m1, _ := cat.MachinePermissions("n1")
	m2, _ := cat.MachinePermissions("n2")
	b := newBed(t, []string{"n1", "n2"}, m1, m2)
	b.controller(deploy.DefaultControllerConfig())
	carry := func(machine string, w *holdWorker) map[string]deploy.RunFunc {
		return map[string]deploy.RunFunc{"build-agent": func(ctx context.Context) error {
			_, js := b.connect(mesh.PrincipalID(mesh.KindAgent, machine), nil)
			cfg := agent.DefaultConfig()
			cfg.Machine, cfg.FetchWait, cfg.Grace, cfg.Platforms = machine, 500*time.Millisecond, 0, []string{mesh.DefaultPlatform}
			a, err := agent.New(cfg, js, w, nil, nil)
			if err != nil {
				return err
			}
			return a.Run(ctx)
		}}
	}
	w1 := &holdWorker{hold: true, started: make(chan string, 1)}
	w2 := &holdWorker{}
	n1, _ := b.node("n1", t.TempDir(), carry("n1", w1))
	n2, _ := b.node("n2", t.TempDir(), carry("n2", w2))
	run(b.ctx, n1.Run)
	testenv.WaitFor(t, 10*time.Second, "n1 to enrol", func() bool { _, ok := b.nodes()["n1"]; return ok })
	assign(t, b, mesh.AssignTool, "build-agent", "n1")
	testenv.WaitFor(t, 10*time.Second, "n1 to start its build agent", func() bool { return n1.Running("build-agent") })

	ask := mesh.Ask{Version: mesh.AskVersion, ID: "ask-1", Plan: "p", Module: "app", Image: "reg.example/app",
		Source: mesh.Source{Repo: meshtest.FleetRepo, Commit: "c1", Path: "app"}, Platform: mesh.DefaultPlatform}
	data, _ := json.Marshal(ask)
	if _, err := b.ajs.Publish(b.ctx, mesh.BuildSubject(mesh.DefaultPlatform), data, jetstream.WithMsgID(ask.ID)); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-w1.started:
		if id != ask.ID {
			t.Fatalf("n1 started %s", id)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("n1's build agent never took the ask")
	}
	run(b.ctx, n2.Run)
	testenv.WaitFor(t, 10*time.Second, "n2 to enrol", func() bool { _, ok := b.nodes()["n2"]; return ok })
	assign(t, b, mesh.AssignTool, "build-agent", "n2")
	testenv.WaitFor(t, 10*time.Second, "n2 to start its build agent", func() bool { return n2.Running("build-agent") })
	if len(w2.builtAsks()) != 0 {
		t.Fatal("n2 built an ask n1 held")
	}
	assign(t, b, mesh.UnassignTool, "build-agent", "n1")
	testenv.WaitFor(t, 20*time.Second, "n2 to build the ask n1 handed back", func() bool { return len(w2.builtAsks()) == 1 })
	if n1.Running("build-agent") {
		t.Fatal("n1's build agent still runs after it was unassigned")
	}
	testenv.WaitFor(t, 10*time.Second, "n1 to report the declaration without build-agent", func() bool {
		v := b.nodes()["n1"]
		return v.Applied == 2 && len(v.Modules) == 0
	})
	b.noViolations()
}

// TestARestartedNodeResumesItsCarriedModules: a node stopped and started
// again (a reboot, `builds up` run again on its state) has acknowledged its
// declaration, so its consumer has nothing for it; it resumes the one it
// applied: its build agent runs again and builds the next ask, with no new
// declaration. The same from a state file kept before the declaration was
// recorded in it. (A restarted node ran nothing until the next assignment.)
func TestARestartedNodeResumesItsCarriedModules(t *testing.T) {
	cat := meshtest.Catalogue(t, nil)
	m1, _ := cat.MachinePermissions("n1")
	b := newBed(t, []string{"n1"}, m1)
	b.controller(deploy.DefaultControllerConfig())
	w := &holdWorker{}
	carry := map[string]deploy.RunFunc{"build-agent": func(ctx context.Context) error {
		_, js := b.connect(mesh.PrincipalID(mesh.KindAgent, "n1"), nil)
		cfg := agent.DefaultConfig()
		cfg.Machine, cfg.FetchWait, cfg.Grace, cfg.Platforms = "n1", 500*time.Millisecond, 0, []string{mesh.DefaultPlatform}
		a, err := agent.New(cfg, js, w, nil, nil)
		if err != nil {
			return err
		}
		return a.Run(ctx)
	}}
	dir := t.TempDir()
	stop := func(n *deploy.Node, r running) {
		t.Helper()
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Fatal("the node did not stop in 30s")
		}
		if n.Running("build-agent") {
			t.Fatal("the stopped node's build agent still runs")
		}
	}
	n, _ := b.node("n1", dir, carry)
	r := run(b.ctx, n.Run)
	testenv.WaitFor(t, 10*time.Second, "n1 to enrol", func() bool { _, ok := b.nodes()["n1"]; return ok })
	assign(t, b, mesh.AssignTool, "build-agent", "n1")
	testenv.WaitFor(t, 10*time.Second, "n1 to start its build agent", func() bool { return n.Running("build-agent") })
	// The module starts before the node records the revision applied:
	// read at once, Applied was seen at 0 (fresh-clone CI).
	testenv.WaitFor(t, 10*time.Second, "n1 to record the declaration applied", func() bool { return n.Applied() > 0 })
	applied := n.Applied()
	stop(n, r)

	for i, kept := range []string{"the declaration", "an older file without it"} {
		if i == 1 {
			file := filepath.Join(dir, "applied.json")
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var old map[string]any
			if err := json.Unmarshal(data, &old); err != nil {
				t.Fatal(err)
			}
			if _, ok := old["declaration"]; !ok {
				t.Fatalf("%s keeps no declaration: %s", file, data)
			}
			delete(old, "declaration")
			data, _ = json.Marshal(old)
			if err := os.WriteFile(file, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		n, _ := b.node("n1", dir, carry)
		r := run(b.ctx, n.Run)
		testenv.WaitFor(t, 10*time.Second, "the restarted n1 ("+kept+") to start its build agent", func() bool { return n.Running("build-agent") })
		if n.Applied() != applied {
			t.Fatalf("the restarted node applied revision %d, want %d resumed (no new declaration)", n.Applied(), applied)
		}
		ask := mesh.Ask{Version: mesh.AskVersion, ID: fmt.Sprintf("ask-%d", i), Plan: "p", Module: "app", Image: "reg.example/app",
			Source: mesh.Source{Repo: meshtest.FleetRepo, Commit: "c1", Path: "app"}, Platform: mesh.DefaultPlatform}
		data, _ := json.Marshal(ask)
		if _, err := b.ajs.Publish(b.ctx, mesh.BuildSubject(mesh.DefaultPlatform), data, jetstream.WithMsgID(ask.ID)); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 20*time.Second, "the restarted n1's build agent ("+kept+") to build "+ask.ID, func() bool {
			return slices.Contains(w.builtAsks(), ask.ID)
		})
		stop(n, r)
	}
	b.noViolations()
}

// TestACarriedModuleThatStopsIsStartedAgain: while it is declared, a
// carried module that stops (a build agent refused its machine's seat while
// the claim of the one before it has not lapsed) is started again, after a
// growing delay; unassigned, it is stopped for good.
func TestACarriedModuleThatStopsIsStartedAgain(t *testing.T) {
	b := newBed(t, []string{"n1"})
	b.controller(deploy.DefaultControllerConfig())
	var mu sync.Mutex
	var starts []time.Time
	carry := map[string]deploy.RunFunc{"base": func(ctx context.Context) error {
		mu.Lock()
		starts = append(starts, time.Now())
		n := len(starts)
		mu.Unlock()
		if n <= 2 {
			return errors.New("machine \"n1\" already has a build agent")
		}
		<-ctx.Done()
		return nil
	}}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(starts) }
	n, _ := b.node("n1", t.TempDir(), carry)
	run(b.ctx, n.Run)
	testenv.WaitFor(t, 10*time.Second, "n1 to enrol", func() bool { _, ok := b.nodes()["n1"]; return ok })
	assign(t, b, mesh.AssignTool, "base", "n1")
	testenv.WaitFor(t, 20*time.Second, "the carried module started a third time", func() bool { return count() == 3 })
	mu.Lock()
	first, second := starts[1].Sub(starts[0]), starts[2].Sub(starts[1])
	mu.Unlock()
	// Lower bounds only: a loaded machine adds to a wait, never takes off.
	if first < 900*time.Millisecond || second < 1900*time.Millisecond {
		t.Errorf("restarted after %s, then %s: want at least 1s, then 2s (doubled)", first, second)
	}
	if !n.Running("base") {
		t.Fatal("the module started again does not run")
	}
	assign(t, b, mesh.UnassignTool, "base", "n1")
	testenv.WaitFor(t, 10*time.Second, "n1 to report the declaration without base", func() bool {
		v := b.nodes()["n1"]
		return v.Applied == 2 && len(v.Modules) == 0
	})
	if n.Running("base") || count() != 3 {
		t.Fatalf("unassigned, the module runs (%v) or was started again (%d starts)", n.Running("base"), count())
	}
}
