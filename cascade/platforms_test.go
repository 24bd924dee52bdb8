package cascade

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

// twoPlatforms is "base" built for amd64 and arm64, and "app" on it for
// amd64 only.
func twoPlatforms(t *testing.T) *State {
	t.Helper()
	ms := []*mesh.Manifest{
		{Module: "base", Build: &mesh.Build{Repo: "https://git.example/fleet.git", Path: "base", Platforms: []string{"linux/amd64", "linux/arm64"}}},
		{Module: "app", Build: &mesh.Build{Repo: "https://git.example/fleet.git", Path: "app", On: []string{"base"}}},
	}
	p, err := planner.New(mesh.NewCatalogue(ms), planner.Trigger{Kind: planner.KindPush, Repo: "https://git.example/fleet.git", Commit: "c0ffee"})
	if err != nil {
		t.Fatal(err)
	}
	return NewState(p, t0)
}

func platformEvent(sub Submit, platform string) (id string) {
	return PlatformAskID(sub.Plan, sub.Module, platform, sub.Attempt)
}

// Builds that announce no started (shorter than the agents'
// StartedDelay) are still seen begun: a module's first platform built
// makes it building on that machine since the build began (its built's
// At less its Duration, by the machine's clock), and a module of one
// platform built from queued is built, on its machine, begun as its built
// says; either counts as dispatched.
func TestBuildsThatAnnouncedNoStartedAreSeenBegun(t *testing.T) {
	s := twoPlatforms(t)
	base := byModule(t, s.Start(at(0)), "base")
	ev := built(base, 5)
	ev.Ask, ev.Digest, ev.On, ev.Duration = platformEvent(base, "linux/amd64"), "sha256:"+strings.Repeat("a", 64), "x86", 2*time.Second
	s.Built(ev, at(5))
	ms := stateOf(t, s, "base")
	if ms.State != Building || ms.On != "x86" || !ms.Started.Equal(at(3)) || !ms.HeldBy("x86") {
		t.Fatalf("base %s on %q since %s: want building on x86 since %s", ms.State, ms.On, ms.Started, at(3))
	}
	if d := s.Dispatched(); !slices.Equal(d, []string{"base"}) {
		t.Fatalf("dispatched %v, want base", d)
	}
	ev.Ask, ev.Digest, ev.On = platformEvent(base, "linux/arm64"), "sha256:"+strings.Repeat("b", 64), "pi"
	s.Built(ev, at(6))
	if ms := stateOf(t, s, "base"); ms.State != Building || !ms.Started.Equal(at(3)) || ms.On != "pi,x86" || !ms.HeldBy("pi") {
		t.Fatalf("base %s on %q since %s: want building since %s on both machines", ms.State, ms.On, ms.Started, at(3))
	}

	one := NewState(plan(t, "solo:"), t0)
	solo := byModule(t, one.Start(at(0)), "solo")
	one.Built(built(solo, 10), at(10))
	ms = stateOf(t, one, "solo")
	if ms.State != Built || ms.On != "m1" || !ms.Started.Equal(at(7)) || ms.Duration != 3*time.Second {
		t.Fatalf("solo %s on %q since %s, took %s: want built on m1 since %s, in 3s", ms.State, ms.On, ms.Started, ms.Duration, at(7))
	}
	if d := one.Dispatched(); !slices.Equal(d, []string{"solo"}) {
		t.Fatalf("dispatched %v, want solo", d)
	}

	// Failed or handed back as soon: the machine held it (its output is
	// the module's, as builds logs shows).
	two := NewState(plan(t, "a:", "b:"), t0)
	subs := two.Start(at(0))
	a, b := byModule(t, subs, "a"), byModule(t, subs, "b")
	two.HandedBack(mesh.HandedBack{Ask: a.AskID, Plan: a.Plan, Module: "a", On: "m3", Attempt: 1, Why: "registry down", At: at(1)})
	two.Failed(failed(b, 1), at(1))
	if ma, mb := stateOf(t, two, "a"), stateOf(t, two, "b"); !ma.HeldBy("m3") || !mb.HeldBy("m2") {
		t.Fatalf("a held by %v, b by %v: want m3 and m2", ma.Held, mb.Held)
	}
}

// A module of two platforms is built when both are and its index is: the
// platforms' builts release nothing, Unindexed names the module with both
// manifests, and the index's built (the module's own ask id) makes it
// built at the index digest, which its dependent is pinned to.
func TestAModuleOfTwoPlatformsIsBuiltByItsIndex(t *testing.T) {
	s := twoPlatforms(t)
	subs := s.Start(at(0))
	base := byModule(t, subs, "base")
	asks := Asks("reg", base)
	if len(asks) != 2 || asks[0].Platform != "linux/amd64" || asks[1].Platform != "linux/arm64" {
		t.Fatalf("asks %+v, want one for each platform", asks)
	}
	ms := stateOf(t, s, "base")
	if len(ms.Platforms) != 2 || ms.Platforms[1].Ask != asks[1].ID || ms.Platforms[1].State != Queued {
		t.Fatalf("platforms %+v, want both queued under the asks' ids", ms.Platforms)
	}

	amd, arm := platformEvent(base, "linux/amd64"), platformEvent(base, "linux/arm64")
	if !s.Started(mesh.Started{Ask: arm, Plan: base.Plan, Module: "base", On: "pi", At: at(1)}) {
		t.Fatal("the arm64 started changed nothing")
	}
	ev := built(base, 2)
	ev.Ask, ev.Digest, ev.On = amd, "sha256:"+strings.Repeat("a", 64), "x86"
	if next := s.Built(ev, at(2)); len(next) != 0 || len(s.Unindexed()) != 0 {
		t.Fatalf("one platform built released %v and unindexed %v, want nothing", next, s.Unindexed())
	}
	wantStates(t, s, map[string]ModuleState{"base": Building, "app": Waiting})
	ev.Ask, ev.Digest, ev.On = arm, "sha256:"+strings.Repeat("b", 64), "pi"
	if next := s.Built(ev, at(3)); len(next) != 0 {
		t.Fatalf("the last platform released %v before the index", next)
	}
	// A restart in between: the state says the same.
	data, _ := json.Marshal(s)
	var re State
	if err := json.Unmarshal(data, &re); err != nil {
		t.Fatal(err)
	}
	un := re.Unindexed()
	if len(un) != 1 || un[0].Module != "base" || un[0].Ask != base.AskID ||
		!slices.Equal(un[0].Manifests, []Manifest{{Platform: "linux/amd64", Digest: "sha256:" + strings.Repeat("a", 64)}, {Platform: "linux/arm64", Digest: "sha256:" + strings.Repeat("b", 64)}}) {
		t.Fatalf("unindexed %+v", un)
	}
	index := "sha256:" + strings.Repeat("c", 64)
	next := re.Built(mesh.Built{Ask: un[0].Ask, Plan: base.Plan, Module: "base", Digest: index, Image: "reg/base@" + index}, at(4))
	if len(next) != 1 || next[0].Module != "app" || next[0].Bases["base"] != index {
		t.Fatalf("the index released %+v, want app pinned to the index %s", next, index)
	}
	if m := stateOf(t, &re, "base"); m.State != Built || m.Digest != index || m.On != "pi,x86" {
		t.Fatalf("base %+v, want built at the index on both machines", m)
	}
	if len(re.Unindexed()) != 0 {
		t.Fatal("still unindexed after the index")
	}
	// A one-platform module has one ask, its own id.
	if a := Asks("reg", next[0]); len(a) != 1 || a[0].ID != next[0].AskID || a[0].Platform != mesh.DefaultPlatform {
		t.Fatalf("app's asks %+v", a)
	}
}

// A platform that fails fails the module (with the platform named) and
// blocks its dependents; a cancel withdraws every platform's ask.
func TestAPlatformFailsItsModuleAndCancelReachesEveryPlatform(t *testing.T) {
	s := twoPlatforms(t)
	base := byModule(t, s.Start(at(0)), "base")
	f := failed(base, 1)
	f.Ask = platformEvent(base, "linux/arm64")
	if blocked := s.Failed(f, at(1)); !slices.Equal(blocked, []string{"app"}) {
		t.Fatalf("blocked %v, want app", blocked)
	}
	m := stateOf(t, s, "base")
	if m.State != Failed || !strings.HasPrefix(m.Message, "linux/arm64: ") {
		t.Fatalf("base %+v, want failed naming the platform", m)
	}
	retry, err := s.Retry("base", at(2))
	if err != nil {
		t.Fatal(err)
	}
	cancel := s.Cancel(at(3))
	want := []string{PlatformAskID(retry.Plan, "base", "linux/amd64", 2), PlatformAskID(retry.Plan, "base", "linux/arm64", 2)}
	if !slices.Equal(cancel, want) {
		t.Fatalf("cancel %v, want both platforms' asks %v", cancel, want)
	}
	if !s.Withdrawn(want[0], at(4)) || stateOf(t, s, "base").State != Cancelling {
		t.Fatal("one platform withdrawn should leave the module cancelling")
	}
	if !s.Withdrawn(want[1], at(4)) || stateOf(t, s, "base").State != Cancelled {
		t.Fatalf("both withdrawn: %+v, want cancelled", stateOf(t, s, "base"))
	}
}

// An ask waiting for a platform no holder builds says so, and stops saying
// so when one is back or the platform's ask is taken.
func TestUnservedAsksSayWhichPlatformTheyWaitFor(t *testing.T) {
	s := twoPlatforms(t)
	base := byModule(t, s.Start(at(0)), "base")
	noArm := func(p string) bool { return p != "linux/arm64" }
	changed, n := s.Unserved(noArm)
	if !slices.Equal(changed, []string{"base"}) || n != 1 || stateOf(t, s, "base").Waiting != "no linux/arm64 machine online" {
		t.Fatalf("changed %v, %d asks, note %q", changed, n, stateOf(t, s, "base").Waiting)
	}
	if changed, _ := s.Unserved(noArm); len(changed) != 0 {
		t.Fatalf("the same note again changed %v", changed)
	}
	s.Started(mesh.Started{Ask: platformEvent(base, "linux/arm64"), Plan: base.Plan, Module: "base", On: "pi", At: at(1)})
	if changed, n := s.Unserved(noArm); !slices.Equal(changed, []string{"base"}) || n != 0 || stateOf(t, s, "base").Waiting != "" {
		t.Fatalf("taken: changed %v, %d asks, note %q", changed, n, stateOf(t, s, "base").Waiting)
	}
}

// A module whose only platform waited for a machine, then was built, says
// nothing of waiting once settled, whether or not the watch looked again
// (the e2e test once showed "built … waiting: no linux/arm64 machine
// online" after the arm machine built it).
func TestASettledModuleSaysNothingOfWaiting(t *testing.T) {
	ms := []*mesh.Manifest{
		{Module: "armonly", Build: &mesh.Build{Repo: "https://git.example/fleet.git", Path: "armonly", Platforms: []string{"linux/arm64"}}},
	}
	p, err := planner.New(mesh.NewCatalogue(ms), planner.Trigger{Kind: planner.KindPush, Repo: "https://git.example/fleet.git", Commit: "c0ffee"})
	if err != nil {
		t.Fatal(err)
	}
	s := NewState(p, t0)
	sub := byModule(t, s.Start(at(0)), "armonly")
	if _, n := s.Unserved(func(p string) bool { return p != "linux/arm64" }); n != 1 || stateOf(t, s, "armonly").Waiting == "" {
		t.Fatalf("%d unserved, note %q: want the ask noted", n, stateOf(t, s, "armonly").Waiting)
	}
	s.Started(mesh.Started{Ask: sub.AskID, Plan: sub.Plan, Module: "armonly", On: "arm", At: at(1)})
	s.Built(mesh.Built{Ask: sub.AskID, Plan: sub.Plan, Module: "armonly", On: "arm", Digest: digest("armonly", 1)}, at(2))
	if m := stateOf(t, s, "armonly"); m.State != Built || m.Waiting != "" {
		t.Fatalf("%s with note %q: want built and no note", m.State, m.Waiting)
	}
}

// A handed-back is a note, not a transition: on a building module it
// takes the machine away (it gave the ask back) and is kept until the next
// started (any machine, the same one too) or outcome; a stray one (another
// ask, a finished module) changes nothing. On a module of two platforms the
// platform given back is queued again, and the module's machines are the
// others'.
func TestAHandedBackIsANoteUntilTheNextStart(t *testing.T) {
	s := NewState(plan(t, "a:", "b: a"), t0)
	a := s.Start(t0)[0]
	back := func(on string, attempt, sec int, sick bool) mesh.HandedBack {
		return mesh.HandedBack{Version: 1, Ask: a.AskID, Plan: a.Plan, Module: "a", On: on, Attempt: attempt, Why: "registry gone",
			InfraSince: at(1), Sick: sick, At: at(sec)}
	}
	if !s.HandedBack(back("m1", 1, 1, true)) {
		t.Fatal("a hand-back of a queued module (a sick machine's pass) changed nothing")
	}
	if !s.Started(started(a, "m1", 2)) || stateOf(t, s, "a").HandedBack != nil {
		t.Fatalf("started did not clear the note: %+v", stateOf(t, s, "a"))
	}
	if !s.HandedBack(back("m1", 2, 3, false)) {
		t.Fatal("a retry's hand-back changed nothing")
	}
	ms := stateOf(t, s, "a")
	if ms.State != Building || ms.On != "" || ms.HandedBack == nil || ms.HandedBack.Attempt != 2 || ms.HandedBack.On != "m1" {
		t.Fatalf("a after the hand-back %+v: want building (a note, not a state), on no machine, noted", ms)
	}
	if s.HandedBack(back("m1", 2, 3, false)) {
		t.Error("a duplicate hand-back changed the state")
	}
	// The same machine takes it again.
	if !s.Started(started(a, "m1", 4)) || stateOf(t, s, "a").On != "m1" || stateOf(t, s, "a").HandedBack != nil {
		t.Fatalf("the same machine's next start: %+v", stateOf(t, s, "a"))
	}
	s.HandedBack(back("m2", 3, 5, true))
	s.Built(built(a, 6), at(6))
	if ms := stateOf(t, s, "a"); ms.State != Built || ms.HandedBack != nil {
		t.Fatalf("a built %+v: want no note", ms)
	}
	if s.HandedBack(back("m2", 4, 7, true)) {
		t.Error("a hand-back of a built module changed the state")
	}
	checkInvariants(t, s)

	p := twoPlatforms(t)
	base := byModule(t, p.Start(at(0)), "base")
	amd, arm := platformEvent(base, "linux/amd64"), platformEvent(base, "linux/arm64")
	p.Started(mesh.Started{Ask: arm, Plan: base.Plan, Module: "base", On: "pi", At: at(1)})
	p.Started(mesh.Started{Ask: amd, Plan: base.Plan, Module: "base", On: "x86", At: at(1)})
	if !p.HandedBack(mesh.HandedBack{Ask: arm, Plan: base.Plan, Module: "base", On: "pi", Attempt: 1, Why: "git fetch failed", Next: at(40), At: at(2)}) {
		t.Fatal("a platform's hand-back changed nothing")
	}
	ms = stateOf(t, p, "base")
	if ms.On != "x86" || ms.Platforms[1].State != Queued || ms.Platforms[1].On != "" || ms.HandedBack == nil {
		t.Fatalf("base %+v: want arm64 queued again, on x86 only, noted", ms)
	}
	if !p.Started(mesh.Started{Ask: arm, Plan: base.Plan, Module: "base", On: "pi2", At: at(41)}) || stateOf(t, p, "base").HandedBack != nil {
		t.Fatalf("arm64's next start: %+v", stateOf(t, p, "base"))
	}
}

// The machines that started a module's current ask are kept on it, each
// once, for a platform's ask too, and forgotten with the ask: a retry is a
// new ask, whose output is its own machines'.
func TestTheMachinesThatStartedAnAskAreKeptWithIt(t *testing.T) {
	s := NewState(plan(t, "a:"), t0)
	a := s.Start(t0)[0]
	s.Started(started(a, "m1", 1))
	s.Started(started(a, "m2", 8))
	s.HandedBack(mesh.HandedBack{Version: 1, Ask: a.AskID, Plan: a.Plan, Module: "a", On: "m2", Attempt: 2, Why: "stopping", At: at(9)})
	s.Started(started(a, "m1", 10))
	// An event for no ask of the module names no holder.
	s.Started(mesh.Started{Ask: a.AskID + "x", Plan: a.Plan, Module: "a", On: "m9", At: at(11)})
	m := stateOf(t, s, "a")
	if want := []string{"m1", "m2"}; !slices.Equal(m.Held, want) || !m.HeldBy("m2") || m.HeldBy("m9") {
		t.Fatalf("held %v, want %v", m.Held, want)
	}
	s.Failed(failed(a, 12), at(12))
	r, err := s.Retry("a", at(13))
	if err != nil {
		t.Fatal(err)
	}
	if m := stateOf(t, s, "a"); len(m.Held) != 0 {
		t.Fatalf("retried: held %v, want none yet", m.Held)
	}
	s.Started(started(r, "m3", 14))
	if m := stateOf(t, s, "a"); !slices.Equal(m.Held, []string{"m3"}) {
		t.Fatalf("the retry's holders %v, want m3", m.Held)
	}
	for k := range maxHeld + 2 {
		s.Started(started(r, fmt.Sprintf("n%d", k), 15+k))
	}
	if m := stateOf(t, s, "a"); len(m.Held) != maxHeld || m.Held[maxHeld-1] != fmt.Sprintf("n%d", maxHeld+1) {
		t.Fatalf("held %v: want the latest %d", m.Held, maxHeld)
	}

	p := twoPlatforms(t)
	base := byModule(t, p.Start(at(0)), "base")
	p.Started(mesh.Started{Ask: platformEvent(base, "linux/arm64"), Plan: base.Plan, Module: "base", On: "pi", At: at(1)})
	p.Started(mesh.Started{Ask: platformEvent(base, "linux/amd64"), Plan: base.Plan, Module: "base", On: "x86", At: at(2)})
	if got := stateOf(t, p, "base").Held; !slices.Equal(got, []string{"pi", "x86"}) {
		t.Fatalf("a module of two platforms: held %v, want pi and x86", got)
	}
}

// A module first heard of from a later delivery of its ask (a started, or
// a built announcing no start) lost an earlier one without a word: a lost
// holder whose machine is not known. Deliveries given back (HandedBack)
// are no loss, nor is a first delivery; a platform's ask is judged alone.
func TestAnAskFirstHeardOfFromALaterDeliveryNotesALostHolder(t *testing.T) {
	s := NewState(plan(t, "a:", "b:", "c:", "d:"), t0)
	subs := s.Start(t0)
	a, b, c, d := byModule(t, subs, "a"), byModule(t, subs, "b"), byModule(t, subs, "c"), byModule(t, subs, "d")
	ev := started(a, "m2", 9)
	ev.Attempt = 2
	s.Started(ev)
	if got, want := stateOf(t, s, "a").Lost, []Lost{{Taken: at(9), TakenBy: "m2"}}; !slices.Equal(got, want) {
		t.Fatalf("a started at its second delivery: lost %+v, want %+v", got, want)
	}
	bt := built(b, 10) // 3 s long, by m1, announced no start
	bt.Attempt = 3
	s.Built(bt, at(10))
	if got, want := stateOf(t, s, "b").Lost, []Lost{{Taken: at(7), TakenBy: "m1"}}; !slices.Equal(got, want) {
		t.Fatalf("b built at its third delivery: lost %+v, want %+v", got, want)
	}
	s.HandedBack(mesh.HandedBack{Ask: c.AskID, Plan: c.Plan, Module: "c", On: "m3", Attempt: 1, Why: "registry down", At: at(1)})
	ev = started(c, "m4", 5)
	ev.Attempt = 2
	s.Started(ev)
	ev = started(d, "m4", 6)
	ev.Attempt = 1
	s.Started(ev)
	for _, m := range []string{"c", "d"} {
		if got := stateOf(t, s, m).Lost; len(got) != 0 {
			t.Errorf("%s: lost %+v, want none (given back, or a first delivery)", m, got)
		}
	}

	p := twoPlatforms(t)
	base := byModule(t, p.Start(at(0)), "base")
	p.Started(mesh.Started{Ask: platformEvent(base, "linux/amd64"), Plan: base.Plan, Module: "base", On: "x86", Attempt: 1, At: at(1)})
	pb := built(base, 6)
	pb.Ask, pb.Digest, pb.On, pb.Attempt = platformEvent(base, "linux/arm64"), "sha256:"+strings.Repeat("b", 64), "pi", 2
	p.Built(pb, at(6))
	if got, want := stateOf(t, p, "base").Lost, []Lost{{Platform: "linux/arm64", Taken: at(3), TakenBy: "pi"}}; !slices.Equal(got, want) {
		t.Fatalf("base: lost %+v, want %+v", got, want)
	}
	checkInvariants(t, s)
}

// A machine whose agent is killed with an ask in hand and restarted begins
// the ask again from a later delivery: its holder there went silent, noted
// lost with the machine taking it again. The same delivery's start again
// (a duplicate) or an earlier one's (late) notes nothing. So for a
// platform's ask.
func TestAMachineBeginningItsAskAgainFromALaterDeliveryIsNotedLost(t *testing.T) {
	s := NewState(plan(t, "a:"), t0)
	a := s.Start(t0)[0]
	ev := func(attempt, sec int) mesh.Started {
		e := started(a, "m1", sec)
		e.Attempt = attempt
		return e
	}
	s.Started(ev(1, 1))
	if !s.Started(ev(2, 5)) {
		t.Fatal("m1's start of a later delivery changed nothing")
	}
	want := []Lost{{On: "m1", Started: at(1), Taken: at(5), TakenBy: "m1"}}
	if got := stateOf(t, s, "a"); !slices.Equal(got.Lost, want) || got.Delivery != 2 || !got.Started.Equal(at(5)) {
		t.Fatalf("a %+v: want m1 lost, begun again at its second delivery", got)
	}
	if s.Started(ev(2, 6)) || s.Started(ev(1, 7)) {
		t.Fatal("a duplicate or late start changed the module")
	}
	if got := stateOf(t, s, "a").Lost; !slices.Equal(got, want) {
		t.Fatalf("lost %+v, want %+v", got, want)
	}
	checkInvariants(t, s)

	p := twoPlatforms(t)
	base := byModule(t, p.Start(at(0)), "base")
	amd := platformEvent(base, "linux/amd64")
	p.Started(mesh.Started{Ask: amd, Plan: base.Plan, Module: "base", On: "x86", Attempt: 1, At: at(1)})
	if !p.Started(mesh.Started{Ask: amd, Plan: base.Plan, Module: "base", On: "x86", Attempt: 2, At: at(4)}) {
		t.Fatal("x86's start of a later delivery of its platform's ask changed nothing")
	}
	if got, want := stateOf(t, p, "base").Lost, []Lost{{Platform: "linux/amd64", On: "x86", Taken: at(4), TakenBy: "x86"}}; !slices.Equal(got, want) {
		t.Fatalf("base: lost %+v, want %+v", got, want)
	}
}

// A machine that starts an ask and goes silent (kill -9: no hand-back)
// loses its claim, and the next machine's start is noted on the module as
// a lost holder, kept after the module is built; a machine that gave the
// ask back is not lost, nor is the same machine starting again.
func TestAMachineThatWentSilentIsNotedLost(t *testing.T) {
	s := NewState(plan(t, "a:", "b: a"), t0)
	a := s.Start(t0)[0]
	s.Started(started(a, "m1", 1))
	if !s.Started(started(a, "m2", 8)) {
		t.Fatal("the next machine's start changed nothing")
	}
	want := []Lost{{On: "m1", Started: at(1), Taken: at(8), TakenBy: "m2"}}
	if got := stateOf(t, s, "a").Lost; !slices.Equal(got, want) {
		t.Fatalf("lost %+v, want %+v", got, want)
	}
	// m2 gives it back (a hand-back says why): m3 taking it is no loss.
	s.HandedBack(mesh.HandedBack{Version: 1, Ask: a.AskID, Plan: a.Plan, Module: "a", On: "m2", Attempt: 2, Why: "stopping", At: at(9)})
	s.Started(started(a, "m3", 10))
	// The same machine's start again is no loss either.
	s.Started(started(a, "m3", 11))
	if got := stateOf(t, s, "a").Lost; !slices.Equal(got, want) {
		t.Fatalf("after a hand-back and a restart: lost %+v, want %+v", got, want)
	}
	s.Built(built(a, 12), at(12))
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back State
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, &back, "a"); got.State != Built || !slices.Equal(got.Lost, want) {
		t.Fatalf("a built and stored: %+v, want the loss kept", got)
	}
	checkInvariants(t, s)

	// Only the latest few are kept.
	s2 := NewState(plan(t, "a:"), t0)
	a2 := s2.Start(t0)[0]
	for k := range maxLost + 3 {
		s2.Started(started(a2, fmt.Sprintf("m%d", k), k+1))
	}
	got := stateOf(t, s2, "a").Lost
	if len(got) != maxLost || got[len(got)-1].On != fmt.Sprintf("m%d", maxLost+1) || got[len(got)-1].TakenBy != fmt.Sprintf("m%d", maxLost+2) {
		t.Fatalf("lost %+v: want the last %d", got, maxLost)
	}

	// A platform's machine goes silent.
	p := twoPlatforms(t)
	base := byModule(t, p.Start(at(0)), "base")
	arm := platformEvent(base, "linux/arm64")
	p.Started(mesh.Started{Ask: arm, Plan: base.Plan, Module: "base", On: "pi", At: at(1)})
	p.Started(mesh.Started{Ask: arm, Plan: base.Plan, Module: "base", On: "pi2", At: at(9)})
	wantP := []Lost{{On: "pi", Platform: "linux/arm64", Taken: at(9), TakenBy: "pi2"}}
	if got := stateOf(t, p, "base").Lost; !slices.Equal(got, wantP) {
		t.Fatalf("base lost %+v, want %+v", got, wantP)
	}
}
