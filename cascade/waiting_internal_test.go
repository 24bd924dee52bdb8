package cascade

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// A flush stores the modules still waiting all at once up to
// waitingPerFlush; beyond, that many of the deepest tiers, none until
// spareEvery has passed since the last share — whether events wait or not
// — and the rest are owed outside the dirty set; a module's newer state
// drops its owed waiting write.
func TestSomeWaitingStoresTheDeepestFirstAShareAtATime(t *testing.T) {
	waiting := map[string]any{}
	for i := range 3 * waitingPerFlush {
		waiting[fmt.Sprintf("m%04d", i)] = ModuleStatus{Tier: i % 3, State: Waiting}
	}
	c := Controller{dirty: maps.Clone(waiting)}
	if got := c.someWaiting(map[string]any{"a": ModuleStatus{State: Waiting}}); len(got) != 1 || len(c.owed) != 0 {
		t.Fatalf("a few: %v, owed %d", got, len(c.owed))
	}
	tiersOf := func(m map[string]any) map[int]int {
		n := map[int]int{}
		for _, v := range m {
			n[v.(ModuleStatus).Tier]++
		}
		return n
	}
	got := c.someWaiting(waiting)
	if n := tiersOf(got); n[2] != waitingPerFlush || len(got) != waitingPerFlush || len(c.owed) != 2*waitingPerFlush {
		t.Fatalf("stored %v, owed %d; want the %d of tier 2 and the rest owed", n, len(c.owed), waitingPerFlush)
	}
	for k := range c.owed {
		if _, in := c.dirty[k]; in {
			t.Fatalf("%s is owed and still dirty: every flush would go through it", k)
		}
	}
	for k := range got {
		if _, in := c.dirty[k]; !in {
			t.Fatalf("%s is stored this flush and not dirty: a refused write would be lost", k)
		}
	}
	// A share was just stored: none now, and the loop's next turn for
	// them is most of spareEvery away.
	if got := c.someWaiting(nil); len(got) != 0 || len(c.owed) != 2*waitingPerFlush {
		t.Fatalf("just after a share: stored %d, owed %d", len(got), len(c.owed))
	}
	if d := c.spareIn(); d <= spareEvery/2 || d > spareEvery {
		t.Fatalf("spareIn just after a share = %s, want within (%s, %s]", d, spareEvery/2, spareEvery)
	}
	// spareEvery later, the next share.
	c.spared = time.Now().Add(-spareEvery)
	if d := c.spareIn(); d != 0 {
		t.Fatalf("spareIn a spareEvery after a share = %s, want 0", d)
	}
	if got := c.someWaiting(nil); tiersOf(got)[1] != waitingPerFlush {
		t.Fatalf("a share due: stored %v", tiersOf(got))
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
	if got := c.someWaiting(nil); len(got) != waitingPerFlush-1 || len(c.owed) != 0 {
		t.Fatalf("the last share: stored %d, owed %d", len(got), len(c.owed))
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
