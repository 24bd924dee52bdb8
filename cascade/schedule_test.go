package cascade

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestAllotPriorityFirst(t *testing.T) {
	claims := []Claim{
		{Plan: "p-big", Owner: "big", Seq: 1, Ready: 100, Busy: 4, Estimate: 1},
		{Plan: "p-urgent", Owner: "fix", Seq: 2, Priority: 10, Ready: 1, Estimate: 1},
	}
	a := Allot(1, claims, nil, SharePolicy{})
	if a.Give["p-urgent"] != 1 || a.Give["p-big"] != 0 {
		t.Fatalf("gave %v, want the one machine to the priority-10 plan", a.Give)
	}
	if got := a.Held["p-big"]; got != "1 machine busy with plan p-urgent (priority 10)" {
		t.Fatalf("held %q", got)
	}
	a = Allot(3, claims, nil, SharePolicy{})
	if a.Give["p-urgent"] != 1 || a.Give["p-big"] != 2 {
		t.Fatalf("gave %v, want 1 to urgent and the other 2 to big", a.Give)
	}
	// The urgent plan waits behind nothing it could outrank.
	a = Allot(0, claims, nil, SharePolicy{})
	if got := a.Held["p-urgent"]; got != "4 machines busy with plan p-big (priority 0)" {
		t.Fatalf("held %q", got)
	}
}

func TestAllotFairShare(t *testing.T) {
	claims := []Claim{
		{Plan: "p-a", Owner: "a", Seq: 1, Ready: 100, Estimate: 1},
		{Plan: "p-b", Owner: "b", Seq: 2, Ready: 100, Estimate: 1},
	}
	a := Allot(10, claims, nil, SharePolicy{})
	if a.Give["p-a"] != 5 || a.Give["p-b"] != 5 {
		t.Fatalf("gave %v, want 5 and 5", a.Give)
	}
	// b used 6 machine-seconds recently: a gets the next machines until
	// they are even.
	a = Allot(10, claims, map[string]float64{"b": 6}, SharePolicy{})
	if a.Give["p-a"] != 8 || a.Give["p-b"] != 2 {
		t.Fatalf("gave %v, want 8 and 2", a.Give)
	}
	// Weights: a weighs 3.
	a = Allot(8, claims, nil, SharePolicy{Weights: map[string]float64{"a": 3}})
	if a.Give["p-a"] != 6 || a.Give["p-b"] != 2 {
		t.Fatalf("gave %v, want 6 and 2", a.Give)
	}
	// Machines a plan holds count: a holds 4, so b gets the next 4.
	claims[0].Busy = 4
	a = Allot(4, claims, nil, SharePolicy{})
	if a.Give["p-b"] != 4 {
		t.Fatalf("gave %v, want all 4 to b", a.Give)
	}
	// One owner out of ready work: the other takes every machine.
	claims[0].Ready = 1
	a = Allot(10, claims, nil, SharePolicy{})
	if a.Give["p-a"] != 1 || a.Give["p-b"] != 9 {
		t.Fatalf("gave %v, want 1 and 9", a.Give)
	}
}

func TestAllotCaps(t *testing.T) {
	claims := []Claim{
		{Plan: "p-a", Owner: "a", Seq: 1, Priority: 5, Ready: 100, Busy: 2, Cap: 4, Estimate: 1},
		{Plan: "p-b", Owner: "b", Seq: 2, Ready: 100, Estimate: 1},
		{Plan: "p-c", Owner: "c", Seq: 3, Ready: 100, Estimate: 1},
	}
	a := Allot(10, claims, nil, SharePolicy{Caps: map[string]int{"b": 3}})
	if a.Give["p-a"] != 2 || a.Give["p-b"] != 3 || a.Give["p-c"] != 5 {
		t.Fatalf("gave %v, want a to its cap (2 more), b to its owner's (3), c the rest (5)", a.Give)
	}
	if got := a.Held["p-a"]; got != "capped at 4 machines" {
		t.Fatalf("a held %q", got)
	}
	if got := a.Held["p-b"]; got != "owner b capped at 3 machines" {
		t.Fatalf("b held %q", got)
	}
	// Capped and nothing else to run: the machines stay idle, the cap holds.
	a = Allot(10, claims[:1], nil, SharePolicy{})
	if a.Give["p-a"] != 2 {
		t.Fatalf("gave %v, want 2", a.Give)
	}
}

// Never more than idle, never more than ready, at any size.
func TestAllotBounds(t *testing.T) {
	for idle := range 12 {
		claims := []Claim{
			{Plan: "p-a", Owner: "a", Ready: 3, Estimate: 2},
			{Plan: "p-b", Owner: "a", Seq: 1, Ready: 2, Estimate: 1},
			{Plan: "p-c", Owner: "c", Priority: -1, Ready: 4, Estimate: 1, Cap: 2},
		}
		a := Allot(idle, claims, nil, SharePolicy{})
		sum := 0
		for _, c := range claims {
			g := a.Give[c.Plan]
			sum += g
			if g > c.Ready || (c.Cap > 0 && g > c.Cap) {
				t.Fatalf("idle %d: %s got %d (ready %d, cap %d)", idle, c.Plan, g, c.Ready, c.Cap)
			}
		}
		if want := min(idle, 3+2+2); sum != want {
			t.Fatalf("idle %d: gave %d in all (%v), want %d", idle, sum, a.Give, want)
		}
		if idle > 0 && idle < 5 && a.Give["p-c"] > 0 {
			t.Fatalf("idle %d: the priority -1 plan got %v before the others ran out", idle, a.Give)
		}
	}
}

func TestShareDecays(t *testing.T) {
	const half = time.Hour
	s := Share{Owner: "a"}.Add(100*time.Second, t0, half)
	if got := s.Now(t0.Add(time.Hour), half); math.Abs(got-50) > 1e-9 {
		t.Fatalf("after one half-life %f, want 50", got)
	}
	s = s.Add(50*time.Second, t0.Add(time.Hour), half)
	if got := s.Now(t0.Add(2*time.Hour), half); math.Abs(got-50) > 1e-9 {
		t.Fatalf("%f, want 50", got)
	}
	if !strings.Contains(machines(2), "machines") {
		t.Fatal(machines(2))
	}
}
