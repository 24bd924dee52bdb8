package cascade

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade/sim"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

// graph is "module: base base ..." lines; every module is from one repo.
func plan(t testing.TB, graph ...string) planner.Plan {
	t.Helper()
	var ms []*mesh.Manifest
	for _, line := range graph {
		name, bases, _ := strings.Cut(line, ":")
		ms = append(ms, &mesh.Manifest{Module: strings.TrimSpace(name),
			Build: &mesh.Build{Repo: "https://git.example/fleet.git", Path: strings.TrimSpace(name), On: strings.Fields(bases)}})
	}
	p, err := planner.New(mesh.NewCatalogue(ms), planner.Trigger{Kind: planner.KindPush,
		Repo: "https://git.example/fleet.git", Commit: "c0ffee"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func digest(module string, attempt int) string {
	return simDigest(fmt.Sprintf("%s/%d", module, attempt))
}

func started(sub Submit, on string, sec int) mesh.Started {
	return mesh.Started{Version: 1, Ask: sub.AskID, Plan: sub.Plan, Module: sub.Module, On: on, Attempt: sub.Attempt, At: at(sec)}
}

func built(sub Submit, sec int) mesh.Built {
	return mesh.Built{Version: 1, Ask: sub.AskID, Plan: sub.Plan, Module: sub.Module, Commit: "c0ffee",
		Digest: digest(sub.Module, sub.Attempt), Image: "reg/" + sub.Module + "@" + digest(sub.Module, sub.Attempt),
		On: "m1", Duration: 3 * time.Second, At: at(sec)}
}

func failed(sub Submit, sec int) mesh.Failed {
	return mesh.Failed{Version: 1, Ask: sub.AskID, Plan: sub.Plan, Module: sub.Module, On: "m2", Reason: mesh.ReasonBuild,
		Message: "RUN make: exit 2", Log: []string{"make: *** [all] Error 2"}, Attempt: sub.Attempt, At: at(sec)}
}

func modules(subs []Submit) []string {
	out := make([]string, len(subs))
	for i, s := range subs {
		out[i] = s.Module
	}
	return out
}

// byModule finds a submit by module.
func byModule(t *testing.T, subs []Submit, module string) Submit {
	t.Helper()
	for _, s := range subs {
		if s.Module == module {
			return s
		}
	}
	t.Fatalf("no submit for %s in %v", module, modules(subs))
	return Submit{}
}

func stateOf(t *testing.T, s *State, module string) ModuleStatus {
	t.Helper()
	m, ok := s.Module(module)
	if !ok {
		t.Fatalf("no module %s", module)
	}
	return m
}

func wantStates(t *testing.T, s *State, want map[string]ModuleState) {
	t.Helper()
	for name, st := range want {
		if got := stateOf(t, s, name).State; got != st {
			t.Errorf("%s is %s, want %s", name, got, st)
		}
	}
	checkInvariants(t, s)
}

func wantModules(t *testing.T, subs []Submit, want ...string) {
	t.Helper()
	if got := modules(subs); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		t.Fatalf("submitted %v, want %v", got, want)
	}
}

// checkInvariants checks what must hold between any two transitions.
func checkInvariants(t *testing.T, s *State) {
	t.Helper()
	status := map[string]ModuleStatus{}
	census := map[ModuleState]int{}
	for _, m := range s.Modules {
		status[m.Module] = m
		census[m.State]++
	}
	// The census Counts and Fill read is what a walk of the modules finds.
	for st, n := range s.ix.census {
		if census[st] != n {
			t.Errorf("census: %d %s, the modules say %d", n, st, census[st])
		}
	}
	for st, n := range census {
		if s.ix.census[st] != n {
			t.Errorf("census: %d %s, the modules say %d", s.ix.census[st], st, n)
		}
	}
	var upstream func(m string, target string) bool
	upstream = func(m, target string) bool {
		for _, b := range status[m].Bases {
			if b == target || upstream(b, target) {
				return true
			}
		}
		return false
	}
	for i, m := range s.Modules {
		notBuilt := 0
		var bad []string
		for _, b := range m.Bases {
			if !status[b].State.done() {
				notBuilt++
			}
			if st := status[b].State; st == Failed || st == Blocked {
				bad = append(bad, b)
			}
		}
		if s.ix.remaining[i] != notBuilt {
			t.Errorf("%s: remaining %d, %d bases not built", m.Module, s.ix.remaining[i], notBuilt)
		}
		switch m.State {
		case Queued, Building, Built:
			if notBuilt > 0 {
				t.Errorf("%s is %s with %d bases not built", m.Module, m.State, notBuilt)
			}
			if m.Ask != AskID(s.Plan, m.Module, m.Attempt) || m.Attempt < 1 {
				t.Errorf("%s: ask %q attempt %d", m.Module, m.Ask, m.Attempt)
			}
		case Waiting:
			if len(bad) > 0 {
				t.Errorf("%s is waiting on failed or blocked %v", m.Module, bad)
			}
		case Ready:
			if notBuilt > 0 {
				t.Errorf("%s is ready with %d bases not built", m.Module, notBuilt)
			}
			if c := s.Counts(); s.Window <= 0 || c.Queued < s.Window {
				t.Errorf("%s is held ready with window %d and %d queued", m.Module, s.Window, c.Queued)
			}
		case Blocked:
			if status[m.BlockedBy].State != Failed || !upstream(m.Module, m.BlockedBy) {
				t.Errorf("%s is blocked by %q (%s), not a failed base", m.Module, m.BlockedBy, status[m.BlockedBy].State)
			}
			if len(bad) == 0 {
				t.Errorf("%s is blocked with no failed or blocked base", m.Module)
			}
		}
		if m.State == Built && m.Digest == "" {
			t.Errorf("%s built without digest", m.Module)
		}
		if m.State == Unchanged && (m.Digest == "" || m.Reuses == "" || m.Key == "" || notBuilt > 0) {
			t.Errorf("%s unchanged with digest %q, reusing %q, key %q, %d bases not built", m.Module, m.Digest, m.Reuses, m.Key, notBuilt)
		}
	}
}

func TestDiamond(t *testing.T) {
	s := NewState(plan(t, "a:", "b: a", "c: a", "d: b c"), t0)
	wantStates(t, s, map[string]ModuleState{"a": Waiting, "b": Waiting, "c": Waiting, "d": Waiting})
	subs := s.Start(at(0))
	wantModules(t, subs, "a")
	a := subs[0]
	if a.Attempt != 1 || a.AskID != AskID(s.Plan, "a", 1) || len(a.Bases) != 0 || a.Plan != s.Plan {
		t.Fatalf("submit a: %+v", a)
	}
	if a.Source.Commit != "c0ffee" || a.Source.Repo != "https://git.example/fleet.git" || a.Source.Path != "a" {
		t.Errorf("source: %+v", a.Source)
	}
	wantModules(t, s.Start(at(0))) // a second Start submits nothing
	if !s.Started(started(a, "m1", 1)) {
		t.Fatal("started a: no change")
	}
	wantStates(t, s, map[string]ModuleState{"a": Building})
	subs = s.Built(built(a, 4), at(4))
	wantModules(t, subs, "b", "c")
	b, c := subs[0], subs[1]
	for _, sub := range subs {
		if !reflect.DeepEqual(sub.Bases, map[string]string{"a": digest("a", 1)}) {
			t.Errorf("%s bases %v", sub.Module, sub.Bases)
		}
	}
	wantStates(t, s, map[string]ModuleState{"a": Built, "b": Queued, "c": Queued, "d": Waiting})
	wantModules(t, s.Built(built(b, 6), at(6))) // d still waits for c
	wantStates(t, s, map[string]ModuleState{"b": Built, "d": Waiting})
	subs = s.Built(built(c, 9), at(9))
	wantModules(t, subs, "d")
	d := subs[0]
	if want := map[string]string{"b": digest("b", 1), "c": digest("c", 1)}; !reflect.DeepEqual(d.Bases, want) {
		t.Errorf("d bases %v, want %v", d.Bases, want)
	}
	if s.Settled() || s.Outcome() != OutcomeRunning {
		t.Fatalf("settled %v outcome %s before d is built", s.Settled(), s.Outcome())
	}
	wantModules(t, s.Built(built(d, 12), at(12)))
	if !s.Settled() || s.Outcome() != OutcomeBuilt {
		t.Fatalf("settled %v outcome %s", s.Settled(), s.Outcome())
	}
	if got, want := s.Counts(), (Counts{Built: 4, Total: 4}); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	ma := stateOf(t, s, "a")
	if ma.Digest != digest("a", 1) || ma.On != "m1" || !ma.Started.Equal(at(1)) || !ma.Finished.Equal(at(4)) ||
		ma.Duration != 3*time.Second || ma.Commit != "c0ffee" || ma.Image == "" {
		t.Errorf("a: %+v", ma)
	}
	if !s.Updated.Equal(at(12)) || !s.Created.Equal(t0) {
		t.Errorf("created %v updated %v", s.Created, s.Updated)
	}
}

func TestFan35(t *testing.T) {
	graph := []string{"base:"}
	for i := range 35 {
		graph = append(graph, fmt.Sprintf("tool-%02d: base", i))
	}
	s := NewState(plan(t, graph...), t0)
	subs := s.Start(t0)
	wantModules(t, subs, "base")
	released := s.Built(built(subs[0], 5), at(5))
	if len(released) != 35 {
		t.Fatalf("released %d, want 35", len(released))
	}
	asks := map[string]bool{}
	for k, sub := range released {
		if sub.Module != fmt.Sprintf("tool-%02d", k) { // equal ranks: name order
			t.Errorf("release %d is %s", k, sub.Module)
		}
		if asks[sub.AskID] {
			t.Errorf("ask id %s twice", sub.AskID)
		}
		asks[sub.AskID] = true
		if !reflect.DeepEqual(sub.Bases, map[string]string{"base": digest("base", 1)}) {
			t.Errorf("%s bases %v", sub.Module, sub.Bases)
		}
	}
	if c := s.Counts(); c.Queued != 35 || c.Built != 1 {
		t.Fatalf("counts %+v", c)
	}
	for k, sub := range released {
		if k%5 == 0 {
			s.Started(started(sub, fmt.Sprintf("m%d", k%4), 6))
		}
		wantModules(t, s.Built(built(sub, 10+k), at(10+k)))
	}
	if s.Outcome() != OutcomeBuilt {
		t.Fatalf("outcome %s", s.Outcome())
	}
}

func TestFailureInTheMiddle(t *testing.T) {
	// a → b → d → e, a → c → f, and g built on both d and c.
	s := NewState(plan(t, "a:", "b: a", "c: a", "d: b", "e: d", "f: c", "g: d c"), t0)
	a := s.Start(t0)[0]
	subs := s.Built(built(a, 1), at(1))
	wantModules(t, subs, "b", "c") // b's path (b d e|g) is longer than c's (c f|g)
	b, c := subs[0], subs[1]
	s.Started(started(b, "m2", 2))

	blocked := s.Failed(failed(b, 3), at(3))
	if !slices.Equal(blocked, []string{"d", "e", "g"}) {
		t.Fatalf("blocked %v", blocked)
	}
	wantStates(t, s, map[string]ModuleState{"b": Failed, "c": Queued, "d": Blocked, "e": Blocked, "g": Blocked, "f": Waiting})
	for _, m := range []string{"d", "e", "g"} {
		if by := stateOf(t, s, m).BlockedBy; by != "b" {
			t.Errorf("%s blocked by %q", m, by)
		}
	}
	mb := stateOf(t, s, "b")
	if mb.Reason != mesh.ReasonBuild || mb.Message != "RUN make: exit 2" || len(mb.Log) != 1 || mb.On != "m2" || mb.Duration != time.Second {
		t.Errorf("b: %+v", mb)
	}
	// The sibling goes on: c releases f, not g (g is blocked).
	wantModules(t, s.Built(built(c, 4), at(4)), "f")
	f := byModule(t, s.Pending(), "f")
	wantModules(t, s.Built(built(f, 5), at(5)))
	if !s.Settled() || s.Outcome() != OutcomeFailed {
		t.Fatalf("settled %v outcome %s", s.Settled(), s.Outcome())
	}
	if got, want := s.Counts(), (Counts{Built: 3, Failed: 1, Blocked: 3, Total: 7}); got != want {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
	// Failures of an earlier ask, or twice, change nothing.
	if s.Failed(failed(b, 6), at(6)) != nil || s.Failed(failed(c, 6), at(6)) != nil {
		t.Fatal("duplicate failed changed something")
	}

	// Retry: a new attempt, dependents back to waiting.
	b2, err := s.Retry("b", at(10))
	if err != nil {
		t.Fatal(err)
	}
	if b2.Attempt != 2 || b2.AskID != AskID(s.Plan, "b", 2) || b2.AskID == b.AskID {
		t.Fatalf("retry submit %+v", b2)
	}
	if !reflect.DeepEqual(b2.Bases, map[string]string{"a": digest("a", 1)}) {
		t.Errorf("retry bases %v", b2.Bases)
	}
	wantStates(t, s, map[string]ModuleState{"b": Queued, "d": Waiting, "e": Waiting, "g": Waiting})
	if mb := stateOf(t, s, "b"); mb.Reason != "" || mb.Message != "" || mb.Log != nil || !mb.Finished.IsZero() {
		t.Errorf("retried b keeps its failure: %+v", mb)
	}
	if s.Settled() || s.Outcome() != OutcomeRunning {
		t.Fatal("a retried plan is settled")
	}
	// The first attempt's late events are stale.
	if s.Started(started(b, "m3", 11)) || s.Built(built(b, 11), at(11)) != nil || s.Failed(failed(b, 11), at(11)) != nil {
		t.Fatal("an event of attempt 1 was applied to attempt 2")
	}
	wantStates(t, s, map[string]ModuleState{"b": Queued})
	if _, err := s.Retry("b", at(11)); !errors.Is(err, ErrNotFailed) {
		t.Fatalf("retrying a queued module: %v", err)
	}

	wantModules(t, s.Built(built(b2, 12), at(12)), "d")
	if got := stateOf(t, s, "b").Digest; got != digest("b", 2) {
		t.Errorf("b digest %s", got)
	}
	d := s.Pending()[0]
	subs = s.Built(built(d, 13), at(13))
	wantModules(t, subs, "e", "g")
	if want := map[string]string{"d": digest("d", 1), "c": digest("c", 1)}; !reflect.DeepEqual(byModule(t, subs, "g").Bases, want) {
		t.Errorf("g bases %v", byModule(t, subs, "g").Bases)
	}
	for _, sub := range subs {
		s.Built(built(sub, 14), at(14))
	}
	if s.Outcome() != OutcomeBuilt {
		t.Fatalf("outcome %s, counts %+v", s.Outcome(), s.Counts())
	}
}

func TestTwoFailuresBlockOneModule(t *testing.T) {
	s := NewState(plan(t, "x:", "y:", "z: x y", "w: z"), t0)
	subs := s.Start(t0)
	x, y := byModule(t, subs, "x"), byModule(t, subs, "y")
	if got := s.Failed(failed(x, 1), at(1)); !slices.Equal(got, []string{"w", "z"}) {
		t.Fatalf("blocked %v", got)
	}
	if got := s.Failed(failed(y, 2), at(2)); got != nil {
		t.Fatalf("z and w are already blocked, got %v", got)
	}
	wantStates(t, s, map[string]ModuleState{"z": Blocked, "w": Blocked})
	x2, err := s.Retry("x", at(3))
	if err != nil {
		t.Fatal(err)
	}
	// z is still blocked, now by y; so is w.
	wantStates(t, s, map[string]ModuleState{"x": Queued, "z": Blocked, "w": Blocked})
	if by := stateOf(t, s, "z").BlockedBy; by != "y" {
		t.Errorf("z blocked by %q, want y", by)
	}
	if by := stateOf(t, s, "w").BlockedBy; by != "y" {
		t.Errorf("w blocked by %q, want y", by)
	}
	wantModules(t, s.Built(built(x2, 4), at(4)))
	y2, err := s.Retry("y", at(5))
	if err != nil {
		t.Fatal(err)
	}
	wantStates(t, s, map[string]ModuleState{"z": Waiting, "w": Waiting})
	wantModules(t, s.Built(built(y2, 6), at(6)), "z")
}

func TestDuplicateAndStrayEvents(t *testing.T) {
	s := NewState(plan(t, "a:", "b: a", "c: b"), t0)
	a := s.Start(t0)[0]
	snapshot := func() []byte {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if !s.Started(started(a, "m1", 1)) {
		t.Fatal("started")
	}
	before := snapshot()
	if s.Started(started(a, "m1", 1)) {
		t.Error("a duplicate started changed the state")
	}
	if s.Started(started(a, "m2", 0)) {
		t.Error("an older started (another machine) changed the state")
	}
	if !bytes.Equal(before, snapshot()) {
		t.Fatal("state changed")
	}
	// The ask redelivered to another machine after the first died.
	if !s.Started(started(a, "m2", 2)) || stateOf(t, s, "a").On != "m2" {
		t.Error("a redelivery did not record the new machine")
	}
	b := s.Built(built(a, 3), at(3))
	wantModules(t, b, "b")
	before = snapshot()
	stray := []func() bool{
		func() bool { return s.Built(built(a, 4), at(4)) != nil },                                   // duplicate built
		func() bool { return s.Started(started(a, "m3", 5)) },                                       // started after built
		func() bool { return s.Failed(failed(a, 5), at(5)) != nil },                                 // failed after built
		func() bool { ev := built(b[0], 5); ev.Plan = "p-other"; return s.Built(ev, at(5)) != nil }, // another plan
		func() bool { ev := built(b[0], 5); ev.Ask = ""; return s.Built(ev, at(5)) != nil },         // no ask
		func() bool { ev := built(b[0], 5); ev.Module = "zz"; return s.Built(ev, at(5)) != nil },    // unknown module
		func() bool { ev := built(b[0], 5); ev.Ask = AskID(s.Plan, "b", 7); return s.Built(ev, at(5)) != nil },
		func() bool { // c was never submitted: an ask id for it matches nothing
			return s.Built(mesh.Built{Ask: AskID(s.Plan, "c", 1), Plan: s.Plan, Module: "c", Digest: digest("c", 1)}, at(5)) != nil
		},
	}
	for k, f := range stray {
		if f() {
			t.Errorf("stray event %d returned work", k)
		}
	}
	if !bytes.Equal(before, snapshot()) {
		t.Fatalf("stray events changed the state:\n%s\n%s", before, snapshot())
	}
	// An event without a plan field is matched by its ask id.
	ev := built(b[0], 6)
	ev.Plan = ""
	wantModules(t, s.Built(ev, at(6)), "c")
}

func TestCancel(t *testing.T) {
	s := NewState(plan(t, "a:", "b:", "x:", "c: a", "d: c", "e: x"), t0)
	subs := s.Start(t0)
	wantModules(t, subs, "a", "x", "b") // by remaining path: a c d, x e, b
	a, x, b := subs[0], subs[1], subs[2]
	s.Started(started(a, "m1", 1))
	s.Failed(failed(x, 2), at(2)) // e blocked
	c := s.Built(built(b, 2), at(2))
	wantModules(t, c)

	asks := s.Cancel(at(3))
	if want := []string{a.AskID}; !slices.Equal(asks, want) {
		t.Fatalf("cancel asks %v, want %v", asks, want)
	}
	// a is building: it shows cancelling, and the plan runs, until its
	// holder says it stopped.
	wantStates(t, s, map[string]ModuleState{"a": Cancelling, "b": Built, "c": Cancelled, "d": Cancelled, "x": Failed, "e": Blocked})
	if s.Settled() || s.Outcome() != OutcomeRunning || !s.Cancelled.Equal(at(3)) {
		t.Fatalf("before the holder's word: settled %v outcome %s cancelled %v", s.Settled(), s.Outcome(), s.Cancelled)
	}
	if got := s.Cancelling(); !slices.Equal(got, []string{a.AskID}) {
		t.Fatalf("cancelling %v, want %v", got, []string{a.AskID})
	}
	if s.Withdrawn(a.AskID, at(3)) {
		t.Fatal("an ask a holder started was withdrawn")
	}
	ev := failed(a, 4)
	ev.Reason = mesh.ReasonCancel
	if blocked := s.Failed(ev, at(4)); blocked != nil {
		t.Fatalf("failed{cancelled} blocked %v", blocked)
	}
	wantStates(t, s, map[string]ModuleState{"a": Cancelled})
	if !s.Settled() || s.Outcome() != OutcomeCancelled {
		t.Fatalf("settled %v outcome %s", s.Settled(), s.Outcome())
	}
	if got, want := s.Counts(), (Counts{Built: 1, Failed: 1, Blocked: 1, Cancelled: 3, Total: 6}); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	// Nothing goes on after a cancel.
	if s.Built(built(a, 4), at(4)) != nil || s.Start(at(4)) != nil || s.Cancel(at(4)) != nil || len(s.Pending()) != 0 {
		t.Fatal("a cancelled plan went on")
	}
	if _, err := s.Retry("x", at(4)); !errors.Is(err, ErrPlanCancelled) {
		t.Fatalf("retry after cancel: %v", err)
	}
	if stateOf(t, s, "a").State != Cancelled {
		t.Fatal("a late built un-cancelled a")
	}

	// Both queued and building asks are returned, sorted.
	s = NewState(plan(t, "q:", "r:", "s:"), t0)
	subs = s.Start(t0)
	s.Started(started(subs[2], "m1", 1))
	if got, want := s.Cancel(at(2)), []string{subs[0].AskID, subs[1].AskID, subs[2].AskID}; !slices.Equal(got, want) {
		t.Fatalf("cancel %v, want %v", got, want)
	}
	// A queued ask withdrawn unseen is cancelled; a built that comes too
	// late is no image of the plan and releases nothing; the one no holder
	// speaks for is cancelled when the bound passes, not before.
	if !s.Withdrawn(subs[0].AskID, at(3)) {
		t.Fatal("a queued ask withdrawn before any holder took it is not cancelled")
	}
	if next := s.Built(built(subs[2], 3), at(3)); next != nil {
		t.Fatalf("a late built released %v", next)
	}
	if _, ok := s.Current(subs[2].Module); ok {
		t.Fatal("a late built became current")
	}
	wantStates(t, s, map[string]ModuleState{subs[0].Module: Cancelled, subs[1].Module: Cancelling, subs[2].Module: Cancelled})
	if got := s.ExpireCancelling(at(3), 10*time.Second); got != nil {
		t.Fatalf("expired %v before the bound", got)
	}
	if got := s.ExpireCancelling(at(12), 10*time.Second); !slices.Equal(got, []string{subs[1].Module}) {
		t.Fatalf("expired %v, want %s", got, subs[1].Module)
	}
	if s.Outcome() != OutcomeCancelled {
		t.Fatalf("outcome %s after the bound", s.Outcome())
	}

	// Cancelling a settled plan does nothing.
	s = NewState(plan(t, "a:"), t0)
	s.Built(built(s.Start(t0)[0], 1), at(1))
	if s.Cancel(at(2)) != nil || s.Outcome() != OutcomeBuilt || !s.Cancelled.IsZero() {
		t.Fatal("cancel of a built plan changed it")
	}
}

func TestJSONRoundTripAndPending(t *testing.T) {
	p := plan(t, "os:", "a: os", "b: os", "c: a b", "d: a", "e: d")
	s := NewState(p, t0)
	s.Seq = 42
	s.SetEstimates(map[string]time.Duration{"a": time.Minute, "d": 5 * time.Minute})
	os := s.Start(t0)[0]
	s.Started(started(os, "m1", 1))
	subs := s.Built(built(os, 2), at(2))
	wantModules(t, subs, "a", "b")
	s.Started(started(byModule(t, subs, "a"), "m1", 3)) // a building, b queued

	data, back := reload(t, s)
	again, _ := json.Marshal(&back)
	if !bytes.Equal(data, again) {
		t.Fatalf("round trip changed the bytes:\n%s\n%s", data, again)
	}
	if !reflect.DeepEqual(back.Modules, s.Modules) || back.Seq != 42 || back.Plan != s.Plan || !back.Created.Equal(t0) {
		t.Fatal("round trip changed the state")
	}
	for _, key := range []string{`"plan":`, `"seq":42`, `"trigger":`, `"summary":`, `"created":`, `"modules":`, `"state":"building"`,
		`"ask":`, `"attempt":1`, `"digest":`, `"image":`, `"on":"m1"`, `"started":`, `"finished":`, `"duration":`, `"estimate":`} {
		if !bytes.Contains(data, []byte(key)) {
			t.Errorf("state JSON has no %s", key)
		}
	}
	checkInvariants(t, &back)

	// After the reload, Pending is the queued asks, exactly as submitted.
	pending := back.Pending()
	if len(pending) != 1 || !reflect.DeepEqual(pending[0], byModule(t, subs, "b")) {
		t.Fatalf("pending %+v, want %+v", pending, byModule(t, subs, "b"))
	}
	// Both copies go on identically.
	for _, st := range []*State{s, &back} {
		wantModules(t, st.Built(built(byModule(t, subs, "a"), 5), at(5)), "d")
		wantModules(t, st.Built(built(byModule(t, subs, "b"), 6), at(6)), "c")
	}
	b1, _ := json.Marshal(s)
	b2, _ := json.Marshal(&back)
	if !bytes.Equal(b1, b2) {
		t.Fatal("the reloaded state diverged")
	}
	if r, _ := back.Rank("a"); r != 60+300+180 { // a (1m) → d (5m) → e (the mean of known estimates, 3m)
		t.Errorf("rank of a after reload = %v", r)
	}
}

func TestUnmarshalRefusesBadState(t *testing.T) {
	s := NewState(plan(t, "a:", "b: a"), t0)
	good, _ := json.Marshal(s)
	for name, edit := range map[string]func(string) string{
		"version":      func(j string) string { return strings.Replace(j, `"version":1`, `"version":9`, 1) },
		"unknown base": func(j string) string { return strings.Replace(j, `"bases":["a"]`, `"bases":["zz"]`, 1) },
		"twice listed": func(j string) string { return strings.Replace(j, `"module":"b"`, `"module":"a"`, 1) },
		"cyclic bases": func(j string) string {
			return strings.Replace(j, `"module":"a","tier":0,`, `"module":"a","tier":0,"bases":["b"],`, 1)
		},
		"not json": func(string) string { return "{" },
	} {
		t.Run(name, func(t *testing.T) {
			bad := edit(string(good))
			if bad == string(good) && name != "not json" {
				t.Fatalf("edit did nothing: %s", good)
			}
			var st State
			err := json.Unmarshal([]byte(bad), &st)
			if err == nil {
				t.Fatal("accepted")
			}
			if name != "not json" && !errors.Is(err, ErrBadState) {
				t.Errorf("err %v, want ErrBadState", err)
			}
		})
	}
}

func TestRetryErrors(t *testing.T) {
	s := NewState(plan(t, "a:", "b: a"), t0)
	s.Start(t0)
	for _, tc := range []struct {
		module string
		want   error
	}{
		{"zz", ErrNotInPlan},
		{"a", ErrNotFailed},
		{"b", ErrNotFailed},
	} {
		if _, err := s.Retry(tc.module, t0); !errors.Is(err, tc.want) {
			t.Errorf("Retry(%s): %v, want %v", tc.module, err, tc.want)
		}
	}
}

func TestReleaseOrder(t *testing.T) {
	// root's dependents: x (a leaf), y → y2 → y3 (a chain), z → z2.
	p := plan(t, "root:", "x: root", "y: root", "y2: y", "y3: y2", "z: root", "z2: z")
	s := NewState(p, t0)
	wantModules(t, s.Built(built(s.Start(t0)[0], 1), at(1)), "y", "z", "x")
	for name, want := range map[string]float64{"root": 4, "y": 3, "z": 2, "x": 1} {
		if r, _ := s.Rank(name); r != want {
			t.Errorf("rank %s = %v, want %v", name, r, want)
		}
	}
	// With estimates the heavy leaf goes first; unknown estimates count the mean.
	s = NewState(p, t0)
	s.SetEstimates(map[string]time.Duration{"x": 10 * time.Minute, "y": time.Minute, "y2": time.Minute, "y3": time.Minute,
		"z": time.Minute})
	wantModules(t, s.Built(built(s.Start(t0)[0], 1), at(1)), "x", "z", "y") // z2 counts the mean, 2m48s
	// Start orders roots the same way.
	s = NewState(plan(t, "a:", "b:", "c: b", "d: c"), t0)
	wantModules(t, s.Start(t0), "b", "a")
}

func TestExternalBases(t *testing.T) {
	ms := []*mesh.Manifest{
		{Module: "os", Build: &mesh.Build{Repo: "https://git.example/os.git", Path: "os"}},
		{Module: "a", Build: &mesh.Build{Repo: "https://git.example/fleet.git", Path: "a", On: []string{"os"}}},
		{Module: "b", Build: &mesh.Build{Repo: "https://git.example/tools.git", Path: "b", On: []string{"a", "os"}}},
	}
	p, err := planner.New(mesh.NewCatalogue(ms), planner.Trigger{Kind: planner.KindPush, Repo: "https://git.example/fleet", Commit: "c0ffee"})
	if err != nil {
		t.Fatal(err)
	}
	s := NewState(p, t0)
	// A base outside the plan is pinned when the plan is made; one with
	// no digest is refused, naming it and what is built on it.
	if err := s.Pin(map[string]string{"other": digest("other", 1)}); !errors.Is(err, ErrNoBase) ||
		!strings.Contains(err.Error(), "os (needed by a)") {
		t.Fatalf("pin without os: %v, want ErrNoBase naming os and a", err)
	}
	osDigest := digest("os", 7)
	if err := s.Pin(map[string]string{"os": osDigest}); err != nil {
		t.Fatal(err)
	}
	if st := stateOf(t, s, "a"); !slices.Equal(st.External, []string{"os"}) {
		t.Fatalf("a: external %v", st.External)
	}
	a := s.Start(t0)[0]
	if !reflect.DeepEqual(a.Bases, map[string]string{"os": osDigest}) {
		t.Fatalf("a: bases %v, want os pinned", a.Bases)
	}
	b := s.Built(built(a, 1), at(1))[0]
	if !reflect.DeepEqual(b.Bases, map[string]string{"a": digest("a", 1), "os": osDigest}) {
		t.Fatalf("b: bases %v, want every base pinned", b.Bases)
	}
	// The pins survive a reload.
	if _, back := reload(t, s); back.External["os"] != osDigest {
		t.Fatalf("reload: external %v", back.External)
	}
	if b.Source.Commit != "" || b.Source.Repo != "https://git.example/tools.git" {
		t.Errorf("b source %+v (another repository: its current commit)", b.Source)
	}
}

// reload is s as a restarted controller reads it back: encoded to JSON
// (data) and decoded again (back).
func reload(t *testing.T, s *State) (data []byte, back State) {
	t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	return data, back
}

func TestEmptyPlan(t *testing.T) {
	s := NewState(plan(t), t0)
	if s.Start(t0) != nil || !s.Settled() || s.Outcome() != OutcomeBuilt || s.Cancel(t0) != nil {
		t.Fatal("empty plan")
	}
	reload(t, s)
}

func TestAskID(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	if got := AskID("p-1a2b3c4d5e6f", "runtime", 1); got != "p-1a2b3c4d5e6f-runtime-1" {
		t.Errorf("AskID = %q", got)
	}
	long := strings.Repeat("m", 200)
	ids := map[string]bool{}
	for _, tc := range []struct {
		plan, module string
		attempt      int
	}{
		{"p-1a2b3c4d5e6f", "runtime", 1}, {"p-1a2b3c4d5e6f", "runtime", 2}, {"r-42", "runtime", 1},
		{"p-1a2b3c4d5e6f", long, 1}, {"p-1a2b3c4d5e6f", long, 2}, {"p-1a2b3c4d5e6f", long + "x", 1},
		{"r-a.b", "runtime", 1}, {"r-a_b", "runtime", 1},
	} {
		id := AskID(tc.plan, tc.module, tc.attempt)
		if !re.MatchString(id) {
			t.Errorf("AskID(%q, %d chars, %d) = %q: not an ask id", tc.plan, len(tc.module), tc.attempt, id)
		}
		if id != AskID(tc.plan, tc.module, tc.attempt) {
			t.Error("not deterministic")
		}
		if ids[id] {
			t.Errorf("ask id %q twice", id)
		}
		ids[id] = true
		ask := mesh.Ask{Version: mesh.AskVersion, ID: id, Plan: tc.plan, Module: "runtime", Image: "x",
			Source: mesh.Source{Repo: "r", Commit: "c"}}
		if err := ask.Validate(); err != nil {
			t.Errorf("the build seat refuses ask id %q: %v", id, err)
		}
	}
}

func TestNewer(t *testing.T) {
	old := Current{Module: "a", Digest: digest("a", 1), Plan: "p-old", Seq: 7, Created: at(0)}
	newer := Current{Module: "a", Digest: digest("a", 2), Plan: "p-new", Seq: 8, Created: at(-60)} // clock skew: seq wins
	for _, tc := range []struct {
		name string
		a, b Current
		want bool
	}{
		{"higher sequence", newer, old, true},
		{"lower sequence", old, newer, false},
		{"same plan replayed", old, old, false},
		{"anything replaces nothing", old, Current{}, true},
		{"nothing replaces anything", Current{}, old, false},
		{"same sequence, later plan", Current{Seq: 7, Created: at(1)}, old, true},
		{"same sequence, earlier plan", Current{Seq: 7, Created: at(-1)}, old, false},
		{"no sequence, by time", Current{Created: at(2)}, Current{Created: at(1)}, true},
	} {
		if got := Newer(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: Newer = %v, want %v", tc.name, got, tc.want)
		}
	}

	// A slow build of an older plan finishing last does not replace the newer one.
	s1 := NewState(plan(t, "a:"), at(0))
	s1.Seq = 1
	s2 := NewState(plan(t, "a:"), at(10))
	s2.Seq = 2
	a2 := s2.Start(at(10))[0]
	s2.Built(built(a2, 20), at(20))
	a1 := s1.Start(at(0))[0]
	s1.Built(built(a1, 30), at(30))
	cur, _ := s2.Current("a")
	late, ok := s1.Current("a")
	if !ok || Newer(late, cur) || !Newer(cur, late) {
		t.Fatalf("the older plan's late result would replace the newer: %+v vs %+v", late, cur)
	}
	if _, ok := NewState(plan(t, "a:"), t0).Current("a"); ok {
		t.Error("Current of a module not built")
	}
}

// TestRandomCascades drives random plans with random completions, failures,
// retries and duplicates, checking the invariants after every event and
// that every module is submitted once per attempt, after all its bases.
func TestRandomCascades(t *testing.T) {
	for seed := range uint64(30) {
		d := sim.RandomLayeredDAG(60, 5, seed)
		p, err := d.Plan()
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 99))
		s := NewState(p, t0)
		s.Window = int(seed % 4) // 0: no window
		inflight := s.Start(t0)
		var done []Submit
		submits := map[string]int{}
		count := func(subs []Submit) {
			for _, sub := range subs {
				submits[sub.AskID]++
				if submits[sub.AskID] > 1 {
					t.Fatalf("seed %d: %s submitted twice", seed, sub.AskID)
				}
				for b, dg := range sub.Bases {
					if m := stateOf(t, s, b); m.State != Built || m.Digest != dg {
						t.Fatalf("seed %d: %s submitted with base %s %s", seed, sub.Module, b, m.State)
					}
				}
			}
		}
		count(inflight)
		for step := 0; len(inflight) > 0; step++ {
			k := rng.IntN(len(inflight))
			sub := inflight[k]
			inflight = slices.Delete(inflight, k, k+1)
			switch r := rng.IntN(10); {
			case r == 0:
				s.Failed(failed(sub, step), at(step))
				if rng.IntN(2) == 0 {
					retry, err := s.Retry(sub.Module, at(step))
					if err != nil {
						t.Fatal(err)
					}
					count([]Submit{retry})
					inflight = append(inflight, retry)
				}
			default:
				s.Started(started(sub, "m", step))
				subs := s.Built(built(sub, step), at(step))
				count(subs)
				inflight = append(inflight, subs...)
			}
			more := s.Fill(at(step))
			count(more)
			inflight = append(inflight, more...)
			if len(done) > 0 && rng.IntN(3) == 0 { // a duplicate of an earlier event
				old := done[rng.IntN(len(done))]
				if s.Built(built(old, step), at(step)) != nil || s.Failed(failed(old, step), at(step)) != nil {
					t.Fatalf("seed %d: a duplicate event did something", seed)
				}
			}
			done = append(done, sub)
			checkInvariants(t, s)
		}
		if !s.Settled() {
			t.Fatalf("seed %d: nothing in flight but not settled: %+v", seed, s.Counts())
		}
		c := s.Counts()
		if c.Built+c.Failed+c.Blocked != c.Total {
			t.Fatalf("seed %d: counts %+v", seed, c)
		}
		if (c.Failed == 0) != (s.Outcome() == OutcomeBuilt) {
			t.Fatalf("seed %d: outcome %s with counts %+v", seed, s.Outcome(), c)
		}
	}
}

func TestWindow(t *testing.T) {
	s := NewState(plan(t, "base:", "a: base", "b: base", "c: base", "d: base", "e: base", "e2: e"), t0)
	s.Window = 2
	s.SetEstimates(map[string]time.Duration{"a": time.Second, "b": 5 * time.Second, "c": 3 * time.Second, "d": 4 * time.Second,
		"e": time.Second, "e2": time.Second})
	base := s.Start(t0)
	wantModules(t, base, "base")
	// Released: the two with the longest remaining path; three held.
	subs := s.Built(built(base[0], 1), at(1))
	wantModules(t, subs, "b", "d")
	wantStates(t, s, map[string]ModuleState{"b": Queued, "d": Queued, "c": Ready, "a": Ready, "e": Ready})
	if c := s.Counts(); c.Ready != 3 || c.Queued != 2 {
		t.Fatalf("counts %+v", c)
	}
	if got := s.Fill(at(1)); got != nil {
		t.Fatalf("fill with a full window: %v", modules(got))
	}
	if s.Settled() || s.Outcome() != OutcomeRunning {
		t.Fatal("held asks settle nothing")
	}
	// A holder starts b: room for one, the best held.
	s.Started(started(subs[0], "m1", 2))
	wantModules(t, s.Fill(at(2)), "c")
	if ms := stateOf(t, s, "a"); ms.Ask != "" || ms.Attempt != 0 {
		t.Errorf("a held ask has an id: %+v", ms)
	}
	// d fails before it starts: its slot frees.
	s.Failed(failed(subs[1], 3), at(3))
	next := s.Fill(at(3))
	wantModules(t, next, "e") // e → e2 (2s) beats a (1s)
	// Pending lists only what was published.
	if got := modules(s.Pending()); !slices.Equal(got, []string{"c", "e"}) {
		t.Errorf("pending %v", got)
	}
	// A retry is published at once, whatever the window.
	d2, err := s.Retry("d", at(4))
	if err != nil || d2.Attempt != 2 {
		t.Fatalf("retry: %+v %v", d2, err)
	}
	if c := s.Counts(); c.Queued != 3 || c.Ready != 1 {
		t.Fatalf("counts %+v", c)
	}
	// The window survives a reload.
	_, back := reload(t, s)
	if back.Window != 2 {
		t.Fatalf("reload: window %d", back.Window)
	}
	// Cancel: held asks are cancelled, only published ones are returned.
	asks := s.Cancel(at(5))
	if want := []string{subs[0].AskID, AskID(s.Plan, "c", 1), AskID(s.Plan, "d", 2), next[0].AskID}; !slices.Equal(asks, want) {
		t.Fatalf("cancel %v, want %v", asks, want)
	}
	wantStates(t, s, map[string]ModuleState{"a": Cancelled, "e2": Cancelled})
	if s.Fill(at(6)) != nil {
		t.Fatal("fill after cancel")
	}
	// Lifting the window publishes every held ask.
	back.Window = 0
	wantModules(t, back.Fill(at(6)), "a")
}

func BenchmarkState1000(b *testing.B) {
	d := sim.RandomLayeredDAG(1000, 10, 1)
	p, err := d.Plan()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s := NewState(p, t0)
		queue := s.Start(t0)
		for len(queue) > 0 {
			sub := queue[0]
			queue = queue[1:]
			queue = append(queue, s.Built(mesh.Built{Ask: sub.AskID, Plan: sub.Plan, Module: sub.Module, Digest: "sha256:x"}, t0)...)
		}
		if s.Outcome() != OutcomeBuilt {
			b.Fatal(s.Outcome())
		}
	}
}
