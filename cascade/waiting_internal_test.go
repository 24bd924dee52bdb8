package cascade

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// A flush stores the modules still waiting all at once up to
// waitingPerFlush; beyond, that many of the deepest tiers, and none while
// events wait, until spareEvery has passed since the last share.
func TestSomeWaitingStoresTheDeepestFirstBetweenEvents(t *testing.T) {
	waiting := map[string]any{}
	for i := range 3 * waitingPerFlush {
		waiting[fmt.Sprintf("m%04d", i)] = ModuleStatus{Tier: i % 3, State: Waiting}
	}
	small := map[string]any{"a": ModuleStatus{State: Waiting}}
	var c Controller
	if got := c.someWaiting(small); len(got) != 1 || c.waitingOwed {
		t.Fatalf("a few: %v, owed %v", got, c.waitingOwed)
	}
	got := c.someWaiting(waiting)
	if len(got) != waitingPerFlush || !c.waitingOwed {
		t.Fatalf("stored %d, owed %v; want %d and more owed", len(got), c.waitingOwed, waitingPerFlush)
	}
	for k, v := range got {
		if v.(ModuleStatus).Tier != 2 {
			t.Fatalf("%s of tier %d stored before the deepest tier's", k, v.(ModuleStatus).Tier)
		}
	}
	// Events wait and a share was just stored: none now.
	c.eventsWaiting = 5
	if got := c.someWaiting(waiting); len(got) != 0 || !c.waitingOwed {
		t.Fatalf("with events waiting, just after a share: stored %d", len(got))
	}
	if d := c.spareIn(5); d <= 0 || d > spareEvery {
		t.Fatalf("spareIn with events waiting = %s, want within (0, %s]", d, spareEvery)
	}
	// spareEvery later, a share even though events wait.
	c.spared = time.Now().Add(-spareEvery)
	if got := c.someWaiting(waiting); len(got) != waitingPerFlush {
		t.Fatalf("a share due with events waiting: stored %d", len(got))
	}
	// A share across tiers: all of the deepest, the rest from the next.
	var across Controller
	mixed := map[string]any{}
	for i, tier := range append(append(slices.Repeat([]int{2}, 100), slices.Repeat([]int{1}, 300)...), slices.Repeat([]int{0}, 300)...) {
		mixed[fmt.Sprintf("x%04d", i)] = ModuleStatus{Tier: tier, State: Waiting}
	}
	perTier := map[int]int{}
	for _, v := range across.someWaiting(mixed) {
		perTier[v.(ModuleStatus).Tier]++
	}
	if perTier[2] != 100 || perTier[1] != waitingPerFlush-100 || perTier[0] != 0 {
		t.Fatalf("a share of tiers 2 (100), 1 (300) and 0 (300): %v", perTier)
	}
	// No event waits: at once.
	c.eventsWaiting = 0
	if got := c.someWaiting(waiting); len(got) != waitingPerFlush || c.spareIn(0) != 0 {
		t.Fatalf("no event waiting: stored %d", len(got))
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
