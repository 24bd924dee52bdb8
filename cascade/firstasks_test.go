package cascade_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// A new plan's first asks go out once the modules they build are stored
// queued, before the modules still waiting are written: on the bus, the
// first ask comes before the waiting modules' writes. A controller
// stopped before those writes takes the modules it finds unstored as
// waiting, and builds the plan.
func TestANewPlansFirstAsksDoNotWaitForItsWaitingModules(t *testing.T) {
	const n = 400
	graph := map[string][]string{"root": nil}
	for i := range n {
		graph[fmt.Sprintf("d%d", i)] = []string{"root"}
	}
	h := newHarness(t, graph, 0)
	h.stopControllerNow()
	h.startControllerWith(func(c *cascade.Config) { c.Window = 0 }) // no holder is idle: publish at once

	var mu sync.Mutex
	var seen []string
	sub, err := h.nc.Subscribe(">", func(m *nats.Msg) {
		mu.Lock()
		seen = append(seen, m.Subject)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	plan := h.push("c1", "push-c1")
	mods := "." + strings.TrimSuffix(cascade.ModulesOf(plan), ">")
	ask := strings.TrimSuffix(mesh.BuildSubject(mesh.DefaultPlatform), mesh.PlatformToken(mesh.DefaultPlatform))
	written := func() (before, all int, asked bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range seen {
			switch {
			case strings.HasPrefix(s, ask) && !asked:
				asked, before = true, all
			case strings.HasPrefix(s, "$KV.") && strings.Contains(s, mods):
				all++
			}
		}
		return before, all, asked
	}
	testenv.WaitFor(t, 20*time.Second, "the first ask and every module's write", func() bool {
		_, all, asked := written()
		return asked && all >= n+1
	})
	_ = sub.Unsubscribe()
	if before, _, _ := written(); before >= n {
		t.Fatalf("%d module writes went before the plan's first ask: the %d waiting modules were stored first", before, n)
	}

	// The waiting modules' writes lost, as a stop between the first asks
	// and them leaves it: the plan resumes with them waiting and builds.
	h.stopControllerNow()
	kv := h.store().KV()
	for i := range n {
		if err := kv.Purge(context.Background(), cascade.ModuleKey(plan, fmt.Sprintf("d%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	h.startController()
	h.startAgent("m1")
	rec, got := h.settle(plan, 60*time.Second)
	if rec.Outcome != cascade.OutcomeBuilt || rec.Counts.Built != n+1 || len(got) != n+1 {
		t.Fatalf("resumed with the waiting modules unstored: %s, %+v, %d modules stored; want all %d built", rec.Outcome, rec.Counts, len(got), n+1)
	}
}
