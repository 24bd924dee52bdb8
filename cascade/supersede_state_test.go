package cascade

import (
	"slices"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

func all(string) bool { return true }

// A newer plan supersedes what has not started; what is in flight
// finishes, releases nothing superseded, and the plan is built.
func TestSupersedeWaitingAndReady(t *testing.T) {
	s := NewState(plan(t, "base:", "a: base", "b: base", "top: a b", "side:"), at(0))
	s.Window = 1
	subs := s.Start(at(0))
	if got := modules(subs); !slices.Equal(got, []string{"base"}) {
		t.Fatalf("start %v", got)
	}
	// side is ready (held by the window), a, b and top wait.
	if m, _ := s.Module("side"); m.State != Ready {
		t.Fatalf("side %s, want ready", m.State)
	}
	got, cancels := s.Supersede("p-newer", all, false, at(1))
	if want := []string{"a", "b", "side", "top"}; !slices.Equal(sorted(got), want) || cancels != nil {
		t.Fatalf("superseded %v, cancels %v; want %v and none", got, cancels, want)
	}
	for _, name := range []string{"a", "b", "top", "side"} {
		m, _ := s.Module(name)
		if m.State != Superseded || m.SupersededBy != "p-newer" || m.Finished != at(1) {
			t.Errorf("%s: %s by %q at %s; want superseded by p-newer at %s", name, m.State, m.SupersededBy, m.Finished, at(1))
		}
	}
	if s.Settled() {
		t.Fatal("settled with base in flight")
	}
	s.Started(started(subs[0], "m1", 2))
	if next := s.Built(built(subs[0], 3), at(3)); next != nil {
		t.Fatalf("base built released %v: its dependents were superseded", modules(next))
	}
	c := s.Counts()
	if !s.Settled() || s.Outcome() != OutcomeBuilt || c.Built != 1 || c.Superseded != 4 || c.Finished() != c.Total {
		t.Fatalf("settled %v, outcome %s, counts %+v; want built: 1 built, 4 superseded", s.Settled(), s.Outcome(), c)
	}
}

// Only what the newer plan builds is superseded, and what waits on it; a
// module waiting on a base in flight that the newer plan does not build
// is released as before.
func TestSupersedeOnlyWhatTheNewerPlanBuilds(t *testing.T) {
	s := NewState(plan(t, "base:", "a: base", "x: a", "b: base"), at(0))
	subs := s.Start(at(0))
	newer := map[string]bool{"a": true}
	got, _ := s.Supersede("p-newer", func(m string) bool { return newer[m] }, false, at(1))
	if want := []string{"a", "x"}; !slices.Equal(got, want) {
		t.Fatalf("superseded %v, want %v (x waits on a)", got, want)
	}
	next := s.Built(built(subs[0], 2), at(2))
	if got := modules(next); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("base built released %v, want [b]", got)
	}
	s.Built(built(next[0], 3), at(3))
	if c := s.Counts(); s.Outcome() != OutcomeBuilt || c.Built != 2 || c.Superseded != 2 {
		t.Fatalf("%s %+v", s.Outcome(), c)
	}
}

// With cancel, a module in flight that the newer plan builds is cancelled
// and settles superseded when its holder stops, or a late built arrives,
// or the bound passes; what waits on it is superseded at once.
func TestSupersedeCancelsInFlight(t *testing.T) {
	for _, end := range []string{"failed", "built", "bound"} {
		t.Run(end, func(t *testing.T) {
			s := NewState(plan(t, "base:", "a: base"), at(0))
			subs := s.Start(at(0))
			s.Started(started(subs[0], "m1", 1))
			got, cancels := s.Supersede("p-newer", all, true, at(2))
			if !slices.Equal(got, []string{"a"}) || !slices.Equal(cancels, []string{subs[0].AskID}) {
				t.Fatalf("superseded %v, cancels %v", got, cancels)
			}
			if m, _ := s.Module("base"); m.State != Cancelling {
				t.Fatalf("base %s, want cancelling", m.State)
			}
			switch end {
			case "failed":
				ev := failed(subs[0], 3)
				ev.Reason = mesh.ReasonCancel
				s.Failed(ev, at(3))
			case "built":
				if next := s.Built(built(subs[0], 3), at(3)); next != nil {
					t.Fatalf("released %v", modules(next))
				}
			case "bound":
				if out := s.ExpireCancelling(at(3), time.Minute); out != nil {
					t.Fatalf("expired %v before the bound", out)
				}
				if out := s.ExpireCancelling(at(63), time.Minute); !slices.Equal(out, []string{"base"}) {
					t.Fatalf("expired %v, want [base]", out)
				}
			}
			m, _ := s.Module("base")
			if m.State != Superseded || m.SupersededBy != "p-newer" || m.Digest != "" {
				t.Fatalf("base %s by %q digest %q; want superseded by p-newer without a digest", m.State, m.SupersededBy, m.Digest)
			}
			if c := s.Counts(); !s.Settled() || s.Outcome() != OutcomeBuilt || c.Superseded != 2 {
				t.Fatalf("%s %+v", s.Outcome(), c)
			}
			if _, ok := s.Current("base"); ok {
				t.Fatal("a superseded module has a current image")
			}
		})
	}
}

// A cancelled plan is not superseded; a finished module stays finished;
// a plan does not supersede itself.
func TestSupersedeLeavesFinished(t *testing.T) {
	s := NewState(plan(t, "base:", "a: base"), at(0))
	subs := s.Start(at(0))
	s.Failed(failed(subs[0], 1), at(1))
	if got, _ := s.Supersede("p-newer", all, true, at(2)); got != nil {
		t.Fatalf("superseded %v of failed and blocked", got)
	}
	if got, _ := s.Supersede(s.Plan, all, true, at(2)); got != nil {
		t.Fatalf("a plan superseded itself: %v", got)
	}
	c := NewState(plan(t, "base:", "a: base"), at(0))
	c.Start(at(0))
	c.Cancel(at(1))
	if got, cancels := c.Supersede("p-newer", all, true, at(2)); got != nil || cancels != nil {
		t.Fatalf("superseded %v, cancels %v of a cancelled plan", got, cancels)
	}
}

// A negative window holds every released ask until the caller widens it.
func TestNegativeWindowHolds(t *testing.T) {
	s := NewState(plan(t, "a:", "b:", "c:"), at(0))
	s.Window = -1
	if subs := s.Start(at(0)); subs != nil {
		t.Fatalf("held window submitted %v", modules(subs))
	}
	if c := s.Counts(); c.Ready != 3 {
		t.Fatalf("%+v, want 3 ready", c)
	}
	s.Window = 2
	if subs := s.Fill(at(1)); len(subs) != 2 {
		t.Fatalf("widened to 2: %v", modules(subs))
	}
	m, _ := s.Module("a")
	if m.ReadyAt != at(0) || m.Queued != at(1) {
		t.Fatalf("a ready at %s, queued %s; want %s, %s", m.ReadyAt, m.Queued, at(0), at(1))
	}
}

// Priority, owner, cap and superseded states survive the round trip a
// restart makes.
func TestSupersededRoundTrip(t *testing.T) {
	s := NewState(plan(t, "base:", "a: base"), at(0))
	s.Priority, s.Owner, s.Cap = 10, "https://git.example/fleet", 4
	s.Start(at(0))
	s.Supersede("p-newer", all, true, at(1))
	_, back := reload(t, s)
	if back.Priority != 10 || back.Owner != s.Owner || back.Cap != 4 || back.Superseding != at(1) {
		t.Fatalf("reloaded %d %q %d %s", back.Priority, back.Owner, back.Cap, back.Superseding)
	}
	if m, _ := back.Module("a"); m.State != Superseded || m.SupersededBy != "p-newer" {
		t.Fatalf("a reloaded %s by %q", m.State, m.SupersededBy)
	}
	if back.Counts() != s.Counts() {
		t.Fatalf("counts %+v, want %+v", back.Counts(), s.Counts())
	}
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }
