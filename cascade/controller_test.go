package cascade_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
)

// These tests run the real controller and real agents on a real NATS
// server; the agents' worker sleeps instead of building (BuildKit's part is
// tested in agent/ and in the end-to-end test).

const repo = meshtest.FleetRepo

// work is a sleeping worker shared by a test's agents: it records every ask
// and builds for the duration its module is given.
type work struct {
	mu    sync.Mutex
	asks  []mesh.Ask
	sleep map[string]time.Duration
	fail  map[string]int // module -> how many attempts fail (build)
	tries map[string]int
}

func newWork() *work {
	return &work{sleep: map[string]time.Duration{}, fail: map[string]int{}, tries: map[string]int{}}
}

func digestOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(h[:])
}

func (w *work) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	w.mu.Lock()
	w.asks = append(w.asks, a)
	d := w.sleep[a.Module]
	w.tries[a.Module]++
	failing := w.tries[a.Module] <= w.fail[a.Module]
	w.mu.Unlock()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return agent.Result{}, context.Cause(ctx)
	}
	if failing {
		log("RUN make: exit code 2")
		return agent.Result{}, fmt.Errorf("%w: RUN make: exit code 2", agent.ErrBuild)
	}
	return agent.Result{Digest: digestOf(a.ID), Ref: a.Image + "@" + digestOf(a.ID)}, nil
}

func (w *work) asksOf(module string) []mesh.Ask {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []mesh.Ask
	for _, a := range w.asks {
		if a.Module == module {
			out = append(out, a)
		}
	}
	return out
}

type harness struct {
	t   *testing.T
	s   *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	cat *mesh.Catalogue
	w   *work
	log *slog.Logger // the controller's; nil discards
	c   *cascade.Controller
	// held, if set, is the next controller's SetHeld.
	held func() error

	// stopControllerNow stops the controller and waits for it.
	stopControllerNow func()
}

func newHarness(t *testing.T, graph map[string][]string, agents int) *harness {
	t.Helper()
	return newHarnessOf(t, meshtest.Catalogue(t, graph), agents)
}

// newHarnessOf is newHarness with a catalogue of the caller's.
func newHarnessOf(t *testing.T, cat *mesh.Catalogue, agents int) *harness {
	t.Helper()
	s := natstest.Server(t, nil)
	nc, js := natstest.Connect(t, s)
	h := &harness{t: t, s: s, nc: nc, js: js, cat: cat, w: newWork()}
	h.startController()
	for i := range agents {
		h.startAgent(fmt.Sprintf("m%d", i+1))
	}
	return h
}

func (h *harness) startController() {
	h.t.Helper()
	h.startControllerWith(nil)
}

// startControllerWith starts the controller with its config tweaked.
func (h *harness) startControllerWith(tweak func(*cascade.Config)) {
	h.t.Helper()
	nc, js := natstest.Dial(h.t, h.s.ClientURL())
	cfg := cascade.DefaultConfig()
	cfg.Registry = "127.0.0.1:1"
	if tweak != nil {
		tweak(&cfg)
	}
	cfg.Images = testenv.AnyImage{} // its workers push nothing
	c, err := cascade.New(cfg, js, h.cat, h.log, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if h.held != nil {
		c.SetHeld(h.held)
	}
	h.c = c
	h.stopControllerNow = cascadetest.Background(h.t, "controller", func(ctx context.Context) error {
		defer nc.Close()
		return c.Run(ctx)
	})
	h.t.Cleanup(h.stopControllerNow)
	// Wait until the controller serves its tools.
	cascadetest.WaitReady(h.t, h.nc, c.Module(), 10*time.Second)
}

func (h *harness) startAgent(machine string) {
	h.t.Helper()
	h.startAgentWith(machine, nil)
}

// startAgentWith is startAgent with the agent's config tweaked.
func (h *harness) startAgentWith(machine string, tweak func(*agent.Config)) {
	h.t.Helper()
	nc, js := natstest.Dial(h.t, h.s.ClientURL())
	cfg := agent.DefaultConfig()
	cfg.Machine = machine
	cfg.FetchWait = 500 * time.Millisecond
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := agent.New(cfg, js, h.w, nil, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	h.t.Cleanup(func() { cancel(); <-done; nc.Close() })
}

func (h *harness) push(commit string, msgID string) string {
	h.t.Helper()
	ev := mesh.Pushed{Version: 1, Repo: repo, Ref: "refs/heads/main", Commit: commit, At: time.Now().UTC()}
	data, _ := json.Marshal(ev)
	if _, err := h.js.Publish(context.Background(), mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID(msgID)); err != nil {
		h.t.Fatal(err)
	}
	return planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: commit})
}

func (h *harness) store() *cascade.Store {
	st, err := cascade.OpenStore(context.Background(), h.js, "build-controller")
	if err != nil {
		h.t.Fatal(err)
	}
	return st
}

// settle waits for a plan to settle and returns its record and modules.
func (h *harness) settle(plan string, d time.Duration) (cascade.PlanRecord, map[string]cascade.ModuleStatus) {
	h.t.Helper()
	st := h.store()
	var rec cascade.PlanRecord
	testenv.WaitFor(h.t, d, "plan "+plan+" to settle", func() bool {
		r, err := st.Plan(context.Background(), plan)
		rec = r
		return err == nil && r.Outcome != cascade.OutcomeRunning && r.Counts.Waiting+r.Counts.Queued+r.Counts.Building == 0
	})
	mods, err := st.Modules(context.Background(), plan)
	if err != nil {
		h.t.Fatal(err)
	}
	return rec, mods
}

func baseDigests(a mesh.Ask) map[string]string {
	out := map[string]string{}
	for _, b := range a.Bases {
		out[b.Module] = b.Digest
	}
	return out
}

func TestDiamondBuildsTheJoinOnceAfterBothBases(t *testing.T) {
	graph := map[string][]string{"a": nil, "b": {"a"}, "c": {"a"}, "d": {"b", "c"}}
	h := newHarness(t, graph, 2)
	h.w.sleep["b"] = 300 * time.Millisecond
	h.w.sleep["c"] = 50 * time.Millisecond
	plan := h.push("c1", "push-c1")
	rec, mods := h.settle(plan, 20*time.Second)
	if rec.Outcome != cascade.OutcomeBuilt || rec.Counts.Built != 4 {
		t.Fatalf("plan %+v", rec)
	}
	for m := range graph {
		if n := len(h.w.asksOf(m)); n != 1 {
			t.Errorf("%s built %d times, want once", m, n)
		}
	}
	d := h.w.asksOf("d")[0]
	if got := baseDigests(d); got["b"] != mods["b"].Digest || got["c"] != mods["c"].Digest || len(got) != 2 {
		t.Errorf("d built on %v, want b=%s c=%s", got, mods["b"].Digest, mods["c"].Digest)
	}
	if !mods["d"].Started.After(mods["b"].Finished) || !mods["d"].Started.After(mods["c"].Finished) {
		t.Errorf("d started %v before b finished %v or c %v", mods["d"].Started, mods["b"].Finished, mods["c"].Finished)
	}
	if b := baseDigests(h.w.asksOf("b")[0]); b["a"] != mods["a"].Digest {
		t.Errorf("b built on %v, want a=%s", b, mods["a"].Digest)
	}
	if mods["d"].Tier != 2 {
		t.Errorf("d in tier %d, want 2", mods["d"].Tier)
	}
}

func TestAFanOf35IsBuiltOnEveryMachine(t *testing.T) {
	graph := map[string][]string{"runtime": nil}
	for i := range 35 {
		graph[fmt.Sprintf("tool-%02d", i+1)] = []string{"runtime"}
	}
	h := newHarness(t, graph, 4)
	for m := range graph {
		h.w.sleep[m] = 50 * time.Millisecond
	}
	rec, mods := h.settle(h.push("c1", "push-c1"), 30*time.Second)
	if rec.Outcome != cascade.OutcomeBuilt || rec.Counts.Built != 36 {
		t.Fatalf("plan %+v", rec)
	}
	machines := map[string]int{}
	for m, st := range mods {
		machines[st.On]++
		if n := len(h.w.asksOf(m)); n != 1 {
			t.Errorf("%s built %d times", m, n)
		}
	}
	// 35 builds of 50 ms released at once to 4 idle machines: every
	// machine builds some.
	if len(machines) != 4 {
		t.Errorf("a fan of 35 was built on %v: want every one of the 4 machines", machines)
	}
}

func TestAFailureBlocksDependentsAndARetryReleasesThem(t *testing.T) {
	graph := map[string][]string{"a": nil, "b": {"a"}, "c": {"a"}, "d": {"b"}, "e": {"c"}, "f": {"d"}}
	h := newHarness(t, graph, 2)
	h.w.fail["b"] = 1
	plan := h.push("c1", "push-c1")
	rec, mods := h.settle(plan, 20*time.Second)
	if rec.Outcome != cascade.OutcomeFailed || rec.Counts.Failed != 1 || rec.Counts.Blocked != 2 || rec.Counts.Built != 3 {
		t.Fatalf("plan %+v", rec)
	}
	if mods["b"].State != cascade.Failed || mods["b"].Reason != mesh.ReasonBuild || len(mods["b"].Log) == 0 {
		t.Errorf("b: %+v", mods["b"])
	}
	for _, m := range []string{"d", "f"} {
		if mods[m].State != cascade.Blocked || mods[m].BlockedBy != "b" {
			t.Errorf("%s: state %s blocked by %q, want blocked by b", m, mods[m].State, mods[m].BlockedBy)
		}
		if n := len(h.w.asksOf(m)); n != 0 {
			t.Errorf("%s was asked for %d times while blocked", m, n)
		}
	}
	for _, m := range []string{"c", "e"} {
		if mods[m].State != cascade.Built {
			t.Errorf("sibling %s: %s, want built", m, mods[m].State)
		}
	}
	if _, err := cascade.Call(context.Background(), h.nc, "build-controller", cascade.ToolRetry, cascade.Request{Plan: plan, Module: "c"}); !errors.Is(err, cascade.ErrNotFailed) {
		t.Errorf("retrying a built module: %v, want ErrNotFailed", err)
	}
	if _, err := cascade.Call(context.Background(), h.nc, "build-controller", cascade.ToolRetry, cascade.Request{Plan: plan, Module: "b"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the retried plan to be built", func() bool {
		r, err := h.store().Plan(context.Background(), plan)
		return err == nil && r.Outcome == cascade.OutcomeBuilt
	})
	_, mods = h.settle(plan, time.Second)
	if mods["b"].Attempt != 2 || baseDigests(h.w.asksOf("d")[0])["b"] != mods["b"].Digest {
		t.Errorf("b attempt %d; d built on %v, want b's retried digest %s", mods["b"].Attempt, baseDigests(h.w.asksOf("d")[0]), mods["b"].Digest)
	}
}

func TestADuplicateTriggerMakesNoSecondPlan(t *testing.T) {
	graph := map[string][]string{"a": nil, "b": {"a"}}
	h := newHarness(t, graph, 1)
	plan := h.push("c1", "push-c1")
	h.push("c1", "push-c1")            // inside the duplicate window
	h.push("c1", "push-c1-redelivery") // as if outside it: another message id
	h.settle(plan, 20*time.Second)
	time.Sleep(500 * time.Millisecond)
	recs, err := h.store().Plans(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || len(h.w.asksOf("a")) != 1 || len(h.w.asksOf("b")) != 1 {
		t.Fatalf("plans %d, a built %d, b built %d: want 1, 1, 1", len(recs), len(h.w.asksOf("a")), len(h.w.asksOf("b")))
	}
	// A rebuild request sent twice is one plan too.
	r1, err := cascade.Call(context.Background(), h.nc, "build-controller", cascade.ToolRebuild, cascade.Request{ID: "req-1", Modules: []string{"b"}})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := cascade.Call(context.Background(), h.nc, "build-controller", cascade.ToolRebuild, cascade.Request{ID: "req-1", Modules: []string{"b"}})
	if err != nil || r1.Plan != r2.Plan || !r1.Created || r2.Created {
		t.Fatalf("rebuild twice: %+v %+v %v", r1, r2, err)
	}
	h.settle(r1.Plan, 20*time.Second)
	if n := len(h.w.asksOf("b")); n != 2 {
		t.Fatalf("b built %d times, want 2 (one per plan)", n)
	}
	if base := baseDigests(h.w.asksOf("b")[1])["a"]; base != digestOf(h.w.asksOf("a")[0].ID) {
		t.Errorf("rebuilt b on a=%s, want a's current digest from the first plan", base)
	}
}

func TestTheNewerPlanWinsAModule(t *testing.T) {
	graph := map[string][]string{"m": nil}
	h := newHarness(t, graph, 2)
	h.w.sleep["m"] = 600 * time.Millisecond
	older := h.push("c1", "push-c1")
	testenv.WaitFor(t, 5*time.Second, "the older plan's build to start", func() bool { return len(h.w.asksOf("m")) == 1 })
	h.w.mu.Lock()
	h.w.sleep["m"] = 10 * time.Millisecond // the newer plan's build finishes first
	h.w.mu.Unlock()
	newer := h.push("c2", "push-c2")
	_, newMods := h.settle(newer, 10*time.Second)
	_, oldMods := h.settle(older, 10*time.Second)
	if !oldMods["m"].Finished.After(newMods["m"].Finished) {
		t.Fatalf("the older plan's m finished at %v, not after the newer's at %v: the test proves nothing",
			oldMods["m"].Finished, newMods["m"].Finished)
	}
	cur, err := h.store().Currents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cur["m"].Plan != newer {
		t.Fatalf("current m from plan %s, want the newer plan %s (the older finished last)", cur["m"].Plan, newer)
	}
}

func TestCancelStopsQueuedAndRunningBuilds(t *testing.T) {
	graph := map[string][]string{"a": nil, "b": {"a"}}
	for i := range 6 {
		graph[fmt.Sprintf("t%d", i)] = []string{"a"}
	}
	h := newHarness(t, graph, 1)
	for m := range graph {
		h.w.sleep[m] = 3 * time.Second
	}
	h.w.sleep["a"] = 10 * time.Millisecond
	plan := h.push("c1", "push-c1")
	testenv.WaitFor(t, 10*time.Second, "a dependent to be building", func() bool {
		mods, _ := h.store().Modules(context.Background(), plan)
		for _, m := range mods {
			if m.State == cascade.Building && m.Module != "a" {
				return true
			}
		}
		return false
	})
	r, err := cascade.Call(context.Background(), h.nc, "build-controller", cascade.ToolCancel, cascade.Request{Plan: plan})
	if err != nil {
		t.Fatal(err)
	}
	// In flight: exactly the one building. The default window holds the
	// rest for idle holders, and the one holder is busy.
	if len(r.Asks) != 1 {
		t.Errorf("cancel named %d asks in flight (%v), want exactly 1", len(r.Asks), r.Asks)
	}
	// Until its holder says it stopped, the building one is cancelling
	// and the plan runs.
	if r.Record.Outcome != cascade.OutcomeRunning || r.Record.Counts.Cancelling != 1 || r.Record.Counts.Cancelled != 6 {
		t.Errorf("right after the cancel: %s %+v, want running with 1 cancelling and 6 cancelled", r.Record.Outcome, r.Record.Counts)
	}
	h.cancelledCleanly(plan, 7, 2)
}

// cancelledCleanly checks a cancelled plan settles cancelled with
// cancelled modules, that worked asks (the one built before and those in
// flight at the cancel) were all the worker was given, a second on, and
// that no ask is left in the seat's queue.
func (h *harness) cancelledCleanly(plan string, cancelled, worked int) {
	h.t.Helper()
	rec, _ := h.settle(plan, 10*time.Second)
	if rec.Outcome != cascade.OutcomeCancelled || rec.Counts.Cancelled != cancelled {
		h.t.Fatalf("plan %+v, want cancelled with %d modules cancelled", rec, cancelled)
	}
	time.Sleep(time.Second)
	h.w.mu.Lock()
	n := len(h.w.asks)
	h.w.mu.Unlock()
	if n != worked {
		h.t.Errorf("%d asks were worked, want %d (the ones built before the cancel and in flight at it)", n, worked)
	}
	info, err := h.js.Stream(context.Background(), mesh.SeatStream(mesh.BuildSeat))
	if err != nil {
		h.t.Fatal(err)
	}
	if msgs := info.CachedInfo().State.Msgs; msgs != 0 {
		h.t.Errorf("%d asks left in the queue", msgs)
	}
}

func TestAControllerRestartedMidPlanResumes(t *testing.T) {
	graph := map[string][]string{"a": nil, "b": {"a"}, "c": {"b"}, "d": {"c"}, "e": {"b"}}
	h := newHarness(t, graph, 2)
	for m := range graph {
		h.w.sleep[m] = 400 * time.Millisecond
	}
	plan := h.push("c1", "push-c1")
	testenv.WaitFor(t, 10*time.Second, "b to be asked for", func() bool { return len(h.w.asksOf("b")) == 1 })
	h.stopControllerNow()
	time.Sleep(time.Second) // b is built while the controller is away
	h.startController()
	rec, mods := h.settle(plan, 20*time.Second)
	if rec.Outcome != cascade.OutcomeBuilt || rec.Counts.Built != 5 {
		t.Fatalf("plan %+v", rec)
	}
	for m := range graph {
		if n := len(h.w.asksOf(m)); n != 1 {
			t.Errorf("%s worked %d times, want once", m, n)
		}
	}
	if got := baseDigests(h.w.asksOf("c")[0])["b"]; got != mods["b"].Digest {
		t.Errorf("c built on b=%s, want %s", got, mods["b"].Digest)
	}
	// Each module's build time is kept, for ranking asks after a restart:
	// in its estimate key, else in its current record.
	est, err := h.store().Estimates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cur, err := h.store().Currents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for m := range graph {
		d, keyed := est[m]
		if !keyed {
			d = cur[m].Duration
		}
		if d < 300*time.Millisecond {
			t.Errorf("estimate of %s = %s (keyed %v), want its build time (~400ms)", m, d, keyed)
		}
	}
}

func TestBadRequestsGetClearErrors(t *testing.T) {
	h := newHarness(t, map[string][]string{"a": nil, "b": {"a"}}, 1)
	ctx := context.Background()
	_, err := cascade.Call(ctx, h.nc, "build-controller", cascade.ToolRebuild, cascade.Request{ID: "r1", Modules: []string{"nope"}})
	if !errors.Is(err, cascade.ErrUnknownModule) {
		t.Errorf("rebuild of an unknown module: %v, want ErrUnknownModule", err)
	} else if msg := err.Error(); strings.Count(msg, "unknown module") != 1 || !strings.Contains(msg, `"nope"`) {
		t.Errorf("rebuild of an unknown module says %q: want the fact once, naming the module", msg)
	}
	// A base outside the plan with no image refuses the plan (no record),
	// naming the base and the command that builds it.
	_, err = cascade.Call(ctx, h.nc, "build-controller", cascade.ToolRebuild, cascade.Request{ID: "r2", Modules: []string{"b"}})
	if !errors.Is(err, cascade.ErrNoBase) || !strings.Contains(err.Error(), "builds rebuild a") {
		t.Errorf("rebuild of b, whose base a has no image: %v, want ErrNoBase naming `builds rebuild a`", err)
	}
	if _, err := h.store().Plan(ctx, planner.PlanID(planner.Trigger{Kind: planner.KindRebuild, ID: "r2"})); !errors.Is(err, cascade.ErrNoPlan) {
		t.Errorf("a refused plan was stored: %v", err)
	}
	if _, err := h.store().Plan(ctx, "p-nope"); !errors.Is(err, cascade.ErrNoPlan) {
		t.Errorf("unknown plan: %v, want ErrNoPlan", err)
	}
	ev := mesh.Pushed{Version: 1, Repo: "https://git.example/other.git", Commit: "x1"}
	data, _ := json.Marshal(ev)
	if _, err := h.js.Publish(ctx, mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data); err != nil {
		t.Fatal(err)
	}
	id := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: ev.Repo, Commit: ev.Commit})
	rec, _ := h.settle(id, 10*time.Second)
	if rec.Outcome != cascade.OutcomeEmpty || rec.Message == "" {
		t.Errorf("push of an unknown repo: %+v, want an empty plan with a message", rec)
	}
	// A malformed event is refused once (Term), never redelivered, and
	// holds up nothing behind it.
	for _, subj := range []string{mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventBuilt)} {
		if _, err := h.js.Publish(ctx, subj, []byte("{not json")); err != nil {
			t.Fatal(err)
		}
	}
	h.settle(h.push("after-garbage", "push-after-garbage"), 10*time.Second)
	cons, err := h.js.Consumer(ctx, mesh.EventsStream, mesh.ModuleConsumer("build-controller"))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "every event settled", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && info.NumRedelivered == 0
	})
}

// A running plan's record carries its forecast: the second plan of a
// chain, its build times known from the first, names the module holding it
// up and an estimated finish; the settled record has none.
func TestARunningPlansRecordCarriesItsForecast(t *testing.T) {
	h := newHarness(t, map[string][]string{"a": nil, "b": {"a"}, "c": {"b"}}, 1)
	h.w.sleep["a"], h.w.sleep["b"], h.w.sleep["c"] = 50*time.Millisecond, 1500*time.Millisecond, 50*time.Millisecond
	first := h.push("c1", "push-c1")
	if rec, _ := h.settle(first, 20*time.Second); rec.Outcome != cascade.OutcomeBuilt || rec.Forecast != nil {
		t.Fatalf("first plan: %+v", rec)
	}
	plan := h.push("c2", "push-c2")
	var rec cascade.PlanRecord
	testenv.WaitFor(t, 20*time.Second, "the record to name b building", func() bool {
		r, err := h.store().Plan(context.Background(), plan)
		rec = r
		if err != nil || r.Forecast == nil {
			return false
		}
		hold, ok := r.Forecast.Holding()
		return ok && hold.Module == "b" && hold.State == cascade.Building
	})
	f := rec.Forecast
	if len(f.Path) != 2 || f.Path[1].Module != "c" || f.Unknown || f.Guessed != 0 {
		t.Errorf("forecast %+v: want the path b → c, every estimate known", f)
	}
	// b took 1.5s last time: between a little and 1.5s+ of it is left,
	// and c's 50ms after it.
	if f.Path[0].Estimate < time.Second || f.Remaining <= 0 || f.Remaining > 3*time.Second || !f.Finish.After(rec.Created) {
		t.Errorf("forecast %+v: want b's estimate of ~1.5s, a few seconds left", f)
	}
	if rec, _ := h.settle(plan, 20*time.Second); rec.Outcome != cascade.OutcomeBuilt || rec.Forecast != nil {
		t.Errorf("settled: %+v, want no forecast", rec)
	}
}

// A plan of more modules waiting than a flush stores (3,000 on one that
// builds) has its first ask out at once and every module stored while that
// first build goes on, in the loop's turns between events, not at its next
// periodic look (5 s) or its forecast's (1 s); none is lost.
func TestABigPlansWaitingModulesAreStoredWhileItsFirstBuildRuns(t *testing.T) {
	graph := map[string][]string{"root": nil}
	for i := range 1500 {
		a, b := fmt.Sprintf("a%04d", i), fmt.Sprintf("b%04d", i)
		graph[a], graph[b] = []string{"root"}, []string{a}
	}
	h := newHarness(t, graph, 1)
	h.w.sleep["root"] = 8 * time.Second
	plan := h.push("c1", "push-big")
	testenv.WaitFor(t, 10*time.Second, "root asked", func() bool { return len(h.w.asksOf("root")) == 1 })
	st := h.store()
	var mods map[string]cascade.ModuleStatus
	testenv.WaitFor(t, 3*time.Second, "every module of the plan stored", func() bool {
		var err error
		mods, err = st.Modules(context.Background(), plan)
		return err == nil && len(mods) == len(graph)
	})
	waiting := 0
	for _, m := range mods {
		if m.State == cascade.Waiting {
			waiting++
		}
	}
	if waiting != len(graph)-1 || mods["root"].State == cascade.Waiting {
		t.Fatalf("%d of %d stored waiting, root %s; want all but root", waiting, len(graph), mods["root"].State)
	}
	if rec, err := st.Plan(context.Background(), plan); err != nil || rec.Counts.Waiting != len(graph)-1 {
		t.Fatalf("record %+v (%v)", rec.Counts, err)
	}
}
