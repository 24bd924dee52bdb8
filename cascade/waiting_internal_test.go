package cascade

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// A flush stores the modules still waiting with its other writes up to
// waitingPerFlush; beyond, it hands that many of the deepest tiers to be
// stored beside the loop, one share at a time, the next spareEvery after
// the last is stored, and owes the rest outside the dirty set; a module's
// newer state drops its owed waiting write.
func TestSomeWaitingStoresTheDeepestFirstAShareAtATime(t *testing.T) {
	waiting := map[string]any{}
	for i := range 3 * waitingPerFlush {
		waiting[fmt.Sprintf("m%04d", i)] = ModuleStatus{Tier: i % 3, State: Waiting}
	}
	gate := make(chan error)
	var written []map[string]any
	c := Controller{dirty: maps.Clone(waiting), writeShare: func(_ context.Context, share map[string]any) error {
		written = append(written, share)
		return <-gate
	}}
	if now, share := c.someWaiting(map[string]any{"a": ModuleStatus{State: Waiting}}); len(now) != 1 || share != nil || len(c.owed) != 0 {
		t.Fatalf("a few: stored with the flush %v, a share %v, owed %d", now, share, len(c.owed))
	}
	tiersOf := func(m map[string]any) map[int]int {
		n := map[int]int{}
		for _, v := range m {
			n[v.(ModuleStatus).Tier]++
		}
		return n
	}
	now, share := c.someWaiting(waiting)
	if n := tiersOf(share); len(now) != 0 || n[2] != waitingPerFlush || len(share) != waitingPerFlush || len(c.owed) != 2*waitingPerFlush {
		t.Fatalf("stored with the flush %d, a share %v, owed %d; want the %d of tier 2 beside the loop and the rest owed", len(now), n, len(c.owed), waitingPerFlush)
	}
	for k := range c.owed {
		if _, in := c.dirty[k]; in {
			t.Fatalf("%s is owed and still dirty: every flush would go through it", k)
		}
	}
	c.storeShare(context.Background(), share)
	// While it is stored, no other share, however long ago the last was.
	c.spared = time.Now().Add(-time.Hour)
	if now, share := c.someWaiting(nil); len(now)+len(share) != 0 || c.shareDone() == nil {
		t.Fatalf("a share in flight: another of %d", len(now)+len(share))
	}
	gate <- nil
	c.shareStored(<-c.shareDone())
	if c.sharing != nil || len(written) != 1 {
		t.Fatalf("stored: in flight %v, written %d shares", c.sharing != nil, len(written))
	}
	// Just stored, with no event worked since it was taken: the next at
	// once.
	if d := c.spareIn(); d != 0 {
		t.Fatalf("spareIn just after a share, the loop idle = %s, want 0", d)
	}
	// With events worked meanwhile: the next is most of spareEvery away.
	c.busySinceShare = true
	if now, share := c.someWaiting(nil); len(now)+len(share) != 0 {
		t.Fatalf("just after a share, the loop busy: another of %d", len(now)+len(share))
	}
	if d := c.spareIn(); d <= spareEvery/2 || d > spareEvery {
		t.Fatalf("spareIn just after a share, the loop busy = %s, want within (%s, %s]", d, spareEvery/2, spareEvery)
	}
	c.spared = time.Now().Add(-spareEvery)
	if _, share := c.someWaiting(nil); tiersOf(share)[1] != waitingPerFlush {
		t.Fatalf("a share due: %v", tiersOf(share))
	}
	// A module released meanwhile: its owed waiting write is dropped.
	var released string
	for k := range c.owed {
		released = k
		break
	}
	c.dirty = map[string]any{released: ModuleStatus{Tier: 0, State: Queued}}
	if _, _, w, _ := c.phases(); len(w) != 0 {
		t.Fatalf("waiting %v", w)
	}
	if _, owed := c.owed[released]; owed {
		t.Fatalf("%s released and still owed waiting", released)
	}
	// No more than a share is owed: the rest at once, and then nothing is
	// owed.
	if _, share := c.someWaiting(nil); len(share) != waitingPerFlush-1 || len(c.owed) != 0 {
		t.Fatalf("the last share: %d, owed %d", len(share), len(c.owed))
	}
}

// A share the store refused is owed again, each module of it that still
// waits with no newer state to store; one released since, or of a plan
// gone, is not.
func TestARefusedShareIsOwedAgain(t *testing.T) {
	st := NewState(plan(t, "a:", "b: a", "c: a", "d: a"), t0)
	st.Start(t0)
	key := func(m string) string { return ModuleKey(st.Plan, m) }
	share := map[string]any{}
	for _, m := range []string{"b", "c", "d"} {
		share[key(m)] = stateOf(t, st, m)
	}
	share[ModuleKey("gone", "x")] = ModuleStatus{Module: "x", State: Waiting}
	c := Controller{plans: map[string]*State{st.Plan: st}, log: slog.New(slog.DiscardHandler),
		dirty: map[string]any{key("c"): ModuleStatus{Module: "c", State: Cancelled}},
		writeShare: func(context.Context, map[string]any) error {
			failed := map[string]error{}
			for k := range share {
				if k != key("d") {
					failed[k] = errors.New("refused")
				}
			}
			return &PutError{Failed: failed}
		}}
	c.storeShare(context.Background(), share)
	c.awaitShare()
	if got := slices.Sorted(maps.Keys(c.owed)); !slices.Equal(got, []string{key("b")}) {
		t.Fatalf("owed again %v, want only %s (c has a newer state, d was stored, x's plan is gone)", got, key("b"))
	}
	// Refused as a whole (no PutError): every module that still waits.
	c.owed = nil
	c.writeShare = func(context.Context, map[string]any) error { return errors.New("no answer") }
	c.storeShare(context.Background(), share)
	c.awaitShare()
	if got := slices.Sorted(maps.Keys(c.owed)); !slices.Equal(got, []string{key("b"), key("d")}) {
		t.Fatalf("owed again %v, want b and d", got)
	}
}

// A share across tiers: all of the deepest, the rest from the next.
func TestDeepestTakesAcrossTiers(t *testing.T) {
	mixed := map[string]any{}
	for i, tier := range append(append(slices.Repeat([]int{2}, 100), slices.Repeat([]int{1}, 300)...), slices.Repeat([]int{0}, 300)...) {
		mixed[fmt.Sprintf("x%04d", i)] = ModuleStatus{Tier: tier, State: Waiting}
	}
	perTier := map[int]int{}
	for _, v := range deepest(mixed, 256) {
		perTier[v.(ModuleStatus).Tier]++
	}
	if perTier[2] != 100 || perTier[1] != 156 || perTier[0] != 0 {
		t.Fatalf("256 of tiers 2 (100), 1 (300) and 0 (300): %v", perTier)
	}
	if got := deepest(mixed, 1000); len(got) != len(mixed) {
		t.Fatalf("more asked than there are: %d", len(got))
	}
}

// The modules of a flush's first asks are stored, and those asks published,
// before the rest of what the flush released.
func TestSplitReleasedPutsTheFirstAsksModulesFirst(t *testing.T) {
	released := map[string]any{}
	for _, m := range []string{"a", "b", "c", "d"} {
		released[ModuleKey("p1", m)] = ModuleStatus{Module: m, State: Queued}
	}
	early, late := splitReleased(released, []Submit{{Plan: "p1", Module: "c"}, {Plan: "p1", Module: "a"}, {Plan: "p2", Module: "a"}})
	if k := slices.Sorted(maps.Keys(early)); !slices.Equal(k, []string{ModuleKey("p1", "a"), ModuleKey("p1", "c")}) {
		t.Fatalf("early %v", k)
	}
	if k := slices.Sorted(maps.Keys(late)); !slices.Equal(k, []string{ModuleKey("p1", "b"), ModuleKey("p1", "d")}) {
		t.Fatalf("late %v", k)
	}
	if len(released) != 4 {
		t.Fatal("splitReleased changed what it was given")
	}
	if early, late := splitReleased(released, nil); len(early) != 0 || len(late) != 4 {
		t.Fatalf("no asks: early %d, late %d", len(early), len(late))
	}
}

// A turn's steps are timed only for a log that takes debug lines, and
// written, if one did something, as one line naming each step, what it
// did and how long it took.
func TestTurnLapsAreDebugLines(t *testing.T) {
	ctx := context.Background()
	quiet := &Controller{log: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	clk := quiet.turnClock(ctx)
	if clk != nil {
		t.Fatal("timed a turn for a log without debug lines")
	}
	clk.lap("nothing", 1) // nil: no-ops
	clk.log(quiet.log, "flushed")
	var out bytes.Buffer
	c := &Controller{log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	clk = c.turnClock(ctx)
	clk.lap("nothing to store", 0)
	clk.log(c.log, "flushed")
	if out.Len() > 0 {
		t.Fatalf("a turn that did nothing was written: %s", out.String())
	}
	clk = c.turnClock(ctx)
	clk.lap("first asks published", 64)
	clk.lap("the rest stored", 700)
	clk.log(c.log, "flushed")
	line := out.String()
	for _, want := range []string{"level=DEBUG", "msg=flushed", `"first asks published"="64 in `, `"the rest stored"="700 in `} {
		if !strings.Contains(line, want) {
			t.Errorf("debug line %q: no %q", line, want)
		}
	}
}
