package cascade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
)

// The scheduler across plans, through the real parts: an embedded NATS
// server, the real controller and real agents whose worker sleeps each
// module's duration (one slot each: one machine each).

// schedUnit is every build's duration in these tests.
const schedUnit = 150 * time.Millisecond

// flat is n modules with no bases, named prefix000…, built from repo.
func flat(repo, prefix string, n int) []*mesh.Manifest {
	out := make([]*mesh.Manifest, n)
	for i := range out {
		name := fmt.Sprintf("%s%03d", prefix, i)
		out[i] = &mesh.Manifest{Module: name, Build: &mesh.Build{Repo: repo, Path: name}}
	}
	return out
}

// newSchedHarness is a server, a controller (its config tweaked) and
// machines agents for a catalogue of mods, every build taking schedUnit.
func newSchedHarness(t *testing.T, mods []*mesh.Manifest, machines int, tweak func(*cascade.Config)) *harness {
	t.Helper()
	s := natstest.Server(t, nil)
	nc, js := natstest.Connect(t, s)
	ms := append(meshtest.MeshManifests(t), mods...)
	if ps := mesh.Check(ms); mesh.HasErrors(ps) {
		t.Fatalf("test catalogue has problems: %v", ps)
	}
	h := &harness{t: t, s: s, nc: nc, js: js, cat: mesh.NewCatalogue(ms), w: newWork()}
	for _, m := range mods {
		h.w.sleep[m.Module] = schedUnit
	}
	h.startControllerWith(tweak)
	for i := range machines {
		// These tests watch builds shorter than the agents' StartedDelay
		// start (the record's building count): each announces started.
		h.startAgentWith(fmt.Sprintf("m%d", i+1), func(c *agent.Config) { c.StartedDelay = 0 })
	}
	return h
}

// pushTo announces a push of repo at commit on ref main, with a schedule.
func (h *harness) pushTo(repo, commit string, sched *mesh.Schedule) string {
	h.t.Helper()
	ev := mesh.Pushed{Version: 1, Repo: repo, Ref: "refs/heads/main", Commit: commit, At: time.Now().UTC(), Schedule: sched}
	data, _ := json.Marshal(ev)
	if _, err := h.js.Publish(context.Background(), mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID(repo+"@"+commit)); err != nil {
		h.t.Fatal(err)
	}
	return planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: commit})
}

// record waits until a plan's record satisfies cond, and returns it.
func (h *harness) record(plan string, d time.Duration, what string, cond func(cascade.PlanRecord) bool) cascade.PlanRecord {
	h.t.Helper()
	st := h.store()
	var rec cascade.PlanRecord
	testenv.WaitFor(h.t, d, "plan "+plan+": "+what, func() bool {
		r, err := st.Plan(context.Background(), plan)
		rec = r
		return err == nil && cond(r)
	})
	return rec
}

func (h *harness) module(plan, module string) cascade.ModuleStatus {
	h.t.Helper()
	mods, err := h.store().Modules(context.Background(), plan)
	if err != nil {
		h.t.Fatal(err)
	}
	return mods[module]
}

func priority(p int) *int { return &p }

// startSlack is what a hand-over may add to a start on a loaded machine
// (built, settle, look at idle holders, publish, fetch, started).
const startSlack = 2 * modelHandOver

// A priority-10 plan pushed while a 200-module plan keeps all 4 machines
// busy starts within one build's duration: the next machine that frees up
// takes it, ahead of the 190-odd asks the big plan holds. Both plans have
// one owner, so that fair share cannot be what serves it first.
func TestAnUrgentPlanStartsWithinOneBuild(t *testing.T) {
	mods := append(flat("https://git.example/big.git", "b", 200), flat("https://git.example/fix.git", "urgent", 1)...)
	h := newSchedHarness(t, mods, 4, nil)
	big := h.pushTo("https://git.example/big.git", "c1", &mesh.Schedule{Owner: "team"})
	h.record(big, 20*time.Second, "4 building and some built", func(r cascade.PlanRecord) bool {
		return r.Counts.Building == 4 && r.Counts.Built >= 4
	})
	pushed := time.Now()
	fix := h.pushTo("https://git.example/fix.git", "c1", &mesh.Schedule{Owner: "team", Priority: priority(10)})
	rec, mods2 := h.settle(fix, 20*time.Second)
	if rec.Priority != 10 || rec.Outcome != cascade.OutcomeBuilt {
		t.Fatalf("urgent plan %s, priority %d", rec.Outcome, rec.Priority)
	}
	waited := mods2["urgent000"].Started.Sub(pushed)
	t.Logf("the urgent plan started %s after its push (one build: %s)", waited, schedUnit)
	if waited > schedUnit+startSlack {
		t.Errorf("the urgent plan started %s after its push: want within one build (%s) and a hand-over (%s)", waited, schedUnit, startSlack)
	}
	if r, _ := h.store().Plan(context.Background(), big); r.Outcome != cascade.OutcomeRunning {
		t.Fatalf("the big plan is %s: the test needs it running", r.Outcome)
	}
}

// `builds priority` re-ranks a plan whose asks are held: pushed at
// priority 0 behind a big plan of its owner, its module waits (and the
// record says behind what); raised to 10, it starts within one build.
func TestPriorityReranksAHeldPlan(t *testing.T) {
	mods := append(flat("https://git.example/big.git", "b", 200), flat("https://git.example/fix.git", "later", 1)...)
	h := newSchedHarness(t, mods, 2, nil)
	big := h.pushTo("https://git.example/big.git", "c1", &mesh.Schedule{Owner: "team"})
	h.record(big, 20*time.Second, "2 building", func(r cascade.PlanRecord) bool { return r.Counts.Building == 2 })
	later := h.pushTo("https://git.example/fix.git", "c1", &mesh.Schedule{Owner: "team"})
	rec := h.record(later, 10*time.Second, "held behind the big plan", func(r cascade.PlanRecord) bool {
		return strings.Contains(r.Held, "busy with plan "+big+" (priority 0)")
	})
	t.Logf("held: %s", rec.Held)
	// Several hand-overs pass and it is still held: the big plan is older.
	h.record(big, 10*time.Second, "6 more built", func(r cascade.PlanRecord) bool { return r.Counts.Built >= 8 })
	if m := h.module(later, "later000"); m.State != cascade.Ready {
		t.Fatalf("the later plan's module is %s, want held (ready) behind the older plan", m.State)
	}
	raised := time.Now()
	r, err := cascade.Call(context.Background(), h.nc, "build-controller", cascade.ToolPriority,
		cascade.Request{Plan: later, Schedule: &mesh.Schedule{Priority: priority(10)}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Record.Priority != 10 {
		t.Fatalf("reply priority %d", r.Record.Priority)
	}
	rec, mods2 := h.settle(later, 10*time.Second)
	waited := mods2["later000"].Started.Sub(raised)
	t.Logf("started %s after its priority was raised", waited)
	if waited > schedUnit+startSlack {
		t.Errorf("started %s after its priority was raised: want within one build (%s) and a hand-over (%s)", waited, schedUnit, startSlack)
	}
	if rec.Priority != 10 || rec.Held != "" {
		t.Errorf("record priority %d, held %q; want 10 and nothing held", rec.Priority, rec.Held)
	}
	// A bad priority is refused, naming the bounds.
	_, err = cascade.Call(context.Background(), h.nc, "build-controller", cascade.ToolPriority,
		cascade.Request{Plan: later, Schedule: &mesh.Schedule{Priority: priority(5000)}})
	if err == nil || !strings.Contains(err.Error(), "want -1000 to 1000") {
		t.Errorf("priority 5000: %v", err)
	}
}

// interval is when a module held a machine.
type interval struct{ from, to time.Time }

func intervals(mods map[string]cascade.ModuleStatus) []interval {
	var out []interval
	for _, m := range mods {
		if !m.Started.IsZero() && !m.Finished.IsZero() {
			out = append(out, interval{m.Started, m.Finished})
		}
	}
	return out
}

// busy is the machine-time of the intervals inside [from, to].
func busy(iv []interval, from, to time.Time) time.Duration {
	var sum time.Duration
	for _, i := range iv {
		a, b := i.from, i.to
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			sum += b.Sub(a)
		}
	}
	return sum
}

// lastStart is when the last of a plan's modules started: until then it
// had work ready.
func lastStart(mods map[string]cascade.ModuleStatus) time.Time {
	var t time.Time
	for _, m := range mods {
		if m.Started.After(t) {
			t = m.Started
		}
	}
	return t
}

// most is the most intervals overlapping at once.
func most(iv []interval) int {
	type edge struct {
		at time.Time
		d  int
	}
	var es []edge
	for _, i := range iv {
		es = append(es, edge{i.from, 1}, edge{i.to, -1})
	}
	slices.SortFunc(es, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d // an end before a start at the same instant
	})
	n, top := 0, 0
	for _, e := range es {
		n += e.d
		top = max(top, n)
	}
	return top
}

// Two repositories pushed together each get half of the machine-time
// (± 10 %) while both have work ready, whatever order they came in.
func TestTwoOwnersShareTheMachines(t *testing.T) {
	mods := append(flat("https://git.example/a.git", "a", 40), flat("https://git.example/b.git", "b", 40)...)
	h := newSchedHarness(t, mods, 4, nil)
	pushed := time.Now()
	pa := h.pushTo("https://git.example/a.git", "c1", nil)
	pb := h.pushTo("https://git.example/b.git", "c1", nil)
	ra, ma := h.settle(pa, 30*time.Second)
	rb, mb := h.settle(pb, 30*time.Second)
	if ra.Owner != "https://git.example/a" || rb.Owner != "https://git.example/b" {
		t.Fatalf("owners %q, %q: want each push's repository", ra.Owner, rb.Owner)
	}
	until := lastStart(ma)
	if lb := lastStart(mb); lb.Before(until) {
		until = lb
	}
	a, b := busy(intervals(ma), pushed, until), busy(intervals(mb), pushed, until)
	share := a.Seconds() / (a + b).Seconds()
	t.Logf("while both had work (%s): a %s, b %s of machine-time: a's share %.2f", until.Sub(pushed).Round(time.Millisecond), a, b, share)
	if share < 0.4 || share > 0.6 {
		t.Errorf("a's share of the machine-time while both had work is %.2f, want 0.5 ± 0.1", share)
	}
	// The machine-time is kept, by owner, for the next plans (and a
	// restarted controller).
	shares, err := h.store().Shares(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{ra.Owner, rb.Owner} {
		if s := shares[o]; s.Seconds < 30*schedUnit.Seconds() {
			t.Errorf("%s's share is %.2fs, want its 40 builds of %s (less their decay)", o, s.Seconds, schedUnit)
		}
	}
}

// A cap is never exceeded, and never idles a machine another plan could
// use: a plan capped at 2 on 4 machines holds 2 at most, says so, and the
// other plan keeps the other 2 busy. The cap is the plan's (push --cap),
// or its owner's (the controller's Config.Caps).
func TestACapIsNeverExceededAndIdlesNoMachine(t *testing.T) {
	for _, by := range []string{"plan", "owner"} {
		t.Run(by, func(t *testing.T) {
			mods := append(flat("https://git.example/a.git", "a", 16), flat("https://git.example/b.git", "b", 24)...)
			var tweak func(*cascade.Config)
			sched := &mesh.Schedule{Cap: 2}
			want := "capped at 2 machines"
			if by == "owner" {
				tweak = func(c *cascade.Config) { c.Caps = map[string]int{"https://git.example/a": 2} }
				sched = nil
				want = "owner https://git.example/a capped at 2 machines"
			}
			h := newSchedHarness(t, mods, 4, tweak)
			pushed := time.Now()
			// The capped plan has the higher priority: without its cap it
			// would take every machine.
			if sched == nil {
				sched = &mesh.Schedule{}
			}
			sched.Priority = priority(5)
			pa := h.pushTo("https://git.example/a.git", "c1", sched)
			h.record(pa, 10*time.Second, "held by its cap", func(r cascade.PlanRecord) bool { return r.Held == want })
			pb := h.pushTo("https://git.example/b.git", "c1", nil)
			_, ma := h.settle(pa, 30*time.Second)
			_, mb := h.settle(pb, 30*time.Second)
			if n := most(intervals(ma)); n > 2 {
				t.Errorf("the capped plan held %d machines at once, want 2 at most", n)
			}
			// While the capped plan had work ready, every machine worked:
			// 2 for it, 2 for the other.
			until := lastStart(ma)
			from := time.Time{}
			for _, m := range mb {
				if from.IsZero() || m.Started.Before(from) {
					from = m.Started
				}
			}
			all := append(intervals(ma), intervals(mb)...)
			used := busy(all, from, until).Seconds() / (4 * until.Sub(from).Seconds())
			t.Logf("from b's first start to a's last: %s, machines %.0f %% busy (pushed %s before)", until.Sub(from).Round(time.Millisecond), 100*used, from.Sub(pushed).Round(time.Millisecond))
			if used < 0.85 {
				t.Errorf("the 4 machines were %.0f %% busy while the capped plan waited on its cap: want every machine used", 100*used)
			}
		})
	}
}

// A second push to a branch supersedes what the first push's plan has not
// started: its waiting modules settle superseded, naming the newer plan,
// and are built once, by the newer plan. What is in flight finishes — or,
// with --cancel-superseded, is cancelled and settles superseded too.
func TestASecondPushSupersedesTheFirstsWaitingModules(t *testing.T) {
	for _, cancel := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancel=%v", cancel), func(t *testing.T) {
			graph := map[string][]string{"base": nil}
			for i := range 6 {
				graph[fmt.Sprintf("app%d", i)] = []string{"base"}
			}
			h := newHarness(t, graph, 1)
			for m := range graph {
				h.w.sleep[m] = 3 * schedUnit
			}
			first := h.push("c1", "push-c1")
			testenv.WaitFor(t, 10*time.Second, "base to be asked for", func() bool { return len(h.w.asksOf("base")) == 1 })
			ev := mesh.Pushed{Version: 1, Repo: repo, Ref: "refs/heads/main", Commit: "c2", At: time.Now().UTC(),
				Schedule: &mesh.Schedule{CancelSuperseded: cancel}}
			data, _ := json.Marshal(ev)
			if _, err := h.js.Publish(context.Background(), mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID("push-c2")); err != nil {
				t.Fatal(err)
			}
			second := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: "c2"})
			r1, m1 := h.settle(first, 20*time.Second)
			r2, _ := h.settle(second, 20*time.Second)
			wantSup := 6
			if cancel {
				wantSup = 7
			}
			if r1.Outcome != cascade.OutcomeBuilt || r1.Counts.Superseded != wantSup || r1.Counts.Built != 7-wantSup {
				t.Errorf("first plan %s %+v: want built, %d superseded", r1.Outcome, r1.Counts, wantSup)
			}
			for name, m := range m1 {
				if m.State == cascade.Superseded && m.SupersededBy != second {
					t.Errorf("%s superseded by %q, want %s", name, m.SupersededBy, second)
				}
				if m.State != cascade.Superseded && m.State != cascade.Built {
					t.Errorf("%s is %s: a module is built or superseded", name, m.State)
				}
			}
			if r2.Outcome != cascade.OutcomeBuilt || r2.Counts.Built != 7 {
				t.Errorf("second plan %s %+v: want all 7 built", r2.Outcome, r2.Counts)
			}
			// Nothing built twice for the same inputs: each module once per
			// commit, and the superseded apps never for c1.
			seen := map[string]int{}
			for m := range graph {
				for _, a := range h.w.asksOf(m) {
					seen[m+"@"+a.Source.Commit]++
				}
			}
			for k, n := range seen {
				if n > 1 {
					t.Errorf("%s worked %d times", k, n)
				}
				if strings.HasPrefix(k, "app") && strings.HasSuffix(k, "@c1") {
					t.Errorf("%s was built though superseded before it started", k)
				}
			}
		})
	}
}

// A controller restarted mid-plan keeps the plans' priorities, the
// owners' shares and the superseded states: the record it writes again
// on resuming says priority 7, a module settled superseded stays so,
// and the machine-time an owner consumed before the restart is counted
// on, not begun again.
func TestARestartKeepsPrioritiesSharesAndSuperseded(t *testing.T) {
	graph := map[string][]string{"base": nil}
	for i := range 4 {
		graph[fmt.Sprintf("app%d", i)] = []string{"base"}
	}
	h := newHarness(t, graph, 1)
	for m := range graph {
		h.w.sleep[m] = 2 * schedUnit
	}
	first := h.push("c1", "push-c1")
	testenv.WaitFor(t, 10*time.Second, "base to be asked for", func() bool { return len(h.w.asksOf("base")) == 1 })
	ev := mesh.Pushed{Version: 1, Repo: repo, Ref: "refs/heads/main", Commit: "c2", At: time.Now().UTC(), Schedule: &mesh.Schedule{Priority: priority(7)}}
	data, _ := json.Marshal(ev)
	if _, err := h.js.Publish(context.Background(), mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID("push-c2")); err != nil {
		t.Fatal(err)
	}
	second := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: "c2"})
	h.record(first, 10*time.Second, "4 superseded", func(r cascade.PlanRecord) bool { return r.Counts.Superseded == 4 })
	h.record(second, 10*time.Second, "2 built", func(r cascade.PlanRecord) bool { return r.Counts.Built >= 2 })
	h.stopControllerNow()
	owner := planner.NormaliseRepo(repo)
	before, err := h.store().Shares(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if before[owner].Seconds <= 0 {
		t.Fatalf("no share stored for %s before the restart: %+v", owner, before)
	}
	stopped := time.Now().UTC()
	h.startController()
	rec := h.record(second, 10*time.Second, "written again since the restart", func(r cascade.PlanRecord) bool {
		return r.Updated.After(stopped)
	})
	if rec.Priority != 7 {
		t.Errorf("the record written after the restart says priority %d, want 7", rec.Priority)
	}
	rec, _ = h.settle(second, 20*time.Second)
	if rec.Priority != 7 || rec.Counts.Built != 5 {
		t.Errorf("second plan priority %d, %+v", rec.Priority, rec.Counts)
	}
	r1, m1 := h.settle(first, 10*time.Second)
	if r1.Counts.Superseded != 4 || m1["app0"].SupersededBy != second {
		t.Errorf("first plan %+v, app0 superseded by %q", r1.Counts, m1["app0"].SupersededBy)
	}
	after, err := h.store().Shares(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The builds after the restart were added to what was stored before
	// it, not counted from zero.
	grew := after[owner].Seconds - before[owner].Now(after[owner].At, cascade.DefaultShareHalfLife)
	if after[owner].Seconds < before[owner].Seconds || grew < 2*schedUnit.Seconds() {
		t.Errorf("%s's share went from %.3fs to %.3fs across the restart and 3 more builds of %s", owner, before[owner].Seconds, after[owner].Seconds, 2*schedUnit)
	}
}
