package cascade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
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

	tap := tapBus(t, h.nc)
	plan := h.push("c1", "push-c1")
	mods := "." + strings.TrimSuffix(cascade.ModulesOf(plan), ">")
	ask := strings.TrimSuffix(mesh.BuildSubject(mesh.DefaultPlatform), mesh.PlatformToken(mesh.DefaultPlatform))
	written := func() (before, all int, asked bool) {
		for _, m := range tap.seen() {
			switch s := m.Subject; {
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
	tap.stop()
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

// An ask a build released goes out once its base is stored built, before
// the rest of what finished with it is written (here the base's current
// image): a flush of hundreds of builts stored them all first, and the
// best asks waited for it.
func TestAReleasedAskWaitsForItsBaseNotForEveryWrite(t *testing.T) {
	h := newHarness(t, map[string][]string{"root": nil, "d": {"root"}}, 0)
	h.stopControllerNow()
	h.startControllerWith(func(c *cascade.Config) { c.Window = 0 }) // published as released

	tap := tapBus(t, h.nc)
	plan := h.push("c1", "push-c1")
	h.startAgent("m1")
	if rec, _ := h.settle(plan, 30*time.Second); rec.Outcome != cascade.OutcomeBuilt {
		t.Fatalf("plan %s", rec.Outcome)
	}
	tap.stop()

	ask := strings.TrimSuffix(mesh.BuildSubject(mesh.DefaultPlatform), mesh.PlatformToken(mesh.DefaultPlatform))
	rootKey, currentKey := "."+cascade.ModuleKey(plan, "root"), "."+cascade.CurrentKey("root")
	rootBuilt, dAsked, current := -1, -1, -1
	for i, m := range tap.seen() {
		switch {
		case strings.HasPrefix(m.Subject, "$KV.") && strings.HasSuffix(m.Subject, rootKey) && rootBuilt < 0:
			var st cascade.ModuleStatus
			if json.Unmarshal(m.Data, &st) == nil && st.State == cascade.Built {
				rootBuilt = i
			}
		case strings.HasPrefix(m.Subject, ask) && dAsked < 0:
			var a mesh.Ask
			if json.Unmarshal(m.Data, &a) == nil && a.Module == "d" {
				dAsked = i
			}
		case strings.HasPrefix(m.Subject, "$KV.") && strings.HasSuffix(m.Subject, currentKey) && current < 0:
			current = i
		}
	}
	if rootBuilt < 0 || dAsked < 0 || current < 0 {
		t.Fatalf("on the bus: root stored built at %d, d's ask at %d, root's current image at %d: want all three", rootBuilt, dAsked, current)
	}
	if dAsked < rootBuilt {
		t.Errorf("d's ask (message %d) went out before root was stored built (message %d)", dAsked, rootBuilt)
	}
	if current < dAsked {
		t.Errorf("root's current image was written (message %d) before d's ask went out (message %d): the ask waited for every write of what finished", current, dAsked)
	}
}

// busTap records every message on the bus, in the order the server sent
// them to its connection.
type busTap struct {
	mu   sync.Mutex
	msgs []*nats.Msg
	sub  *nats.Subscription
}

func tapBus(t *testing.T, nc *nats.Conn) *busTap {
	t.Helper()
	tap := &busTap{}
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		tap.mu.Lock()
		tap.msgs = append(tap.msgs, m)
		tap.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	tap.sub = sub
	return tap
}

// seen is what the tap recorded so far.
func (b *busTap) seen() []*nats.Msg {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.msgs)
}

func (b *busTap) stop() { _ = b.sub.Unsubscribe() }
