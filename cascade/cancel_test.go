package cascade_test

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// TestCancelOfARealBuildWaitsForTheAgentsWord cancels a plan while a real
// agent builds a long RUN sleep on real BuildKit: the module shows
// cancelling until the agent reports failed{cancelled}, and only then
// cancelled; if the agent kept building, the plan would stay running past
// the test's bound (the sleep is a minute, the cancel bound ten).
func TestCancelOfARealBuildWaitsForTheAgentsWord(t *testing.T) {
	bed := cascadetest.RealBed(t, map[string]string{
		"busybox/Dockerfile": "FROM scratch\n",
		"slow/Dockerfile":    "FROM busybox\nRUN echo begun && sleep 60 && echo done > /done\n",
	}, map[string][]string{"busybox": nil, "slow": {"busybox"}})
	nc, js, ctx := bed.NC, bed.JS, bed.Ctx
	bk := testenv.Buildkitd(t, bed.Reg)

	cfg := cascade.DefaultConfig()
	cfg.Registry = bed.Reg
	cfg.CancelWait = 10 * time.Minute // only the agent's word may end the cancel
	bed.Controller(t, cfg)

	bed.Agent(t, bk, "m1")

	var builtEvents sync.Map
	sub, err := nc.Subscribe(mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventBuilt), func(m *nats.Msg) { builtEvents.Store(string(m.Data), true) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	// The base outside the plan is resolved from the registry when the
	// plan is made.
	r, err := cascade.Call(ctx, nc, "build-controller", cascade.ToolRebuild, cascade.Request{ID: "slow-1", Modules: []string{"slow"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Record.External["busybox"] == "" {
		t.Fatalf("plan record %+v: want busybox pinned", r.Record)
	}
	store, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
	// Every state the module passes through, from the store's own history.
	var mu sync.Mutex
	var seen []cascade.ModuleState
	watch, err := store.KV().Watch(ctx, cascade.ModuleKey(r.Plan, "slow"))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	bed.WG.Go(func() {
		for e := range watch.Updates() {
			if e == nil {
				continue
			}
			var m cascade.ModuleStatus
			if json.Unmarshal(e.Value(), &m) == nil {
				mu.Lock()
				if len(seen) == 0 || seen[len(seen)-1] != m.State {
					seen = append(seen, m.State)
				}
				mu.Unlock()
			}
		}
	})
	states := func() []cascade.ModuleState { mu.Lock(); defer mu.Unlock(); return slices.Clone(seen) }
	testenv.WaitFor(t, 60*time.Second, "slow to be building", func() bool { return slices.Contains(states(), cascade.Building) })

	cr, err := cascade.Call(ctx, nc, "build-controller", cascade.ToolCancel, cascade.Request{Plan: r.Plan})
	if err != nil {
		t.Fatal(err)
	}
	if len(cr.Asks) != 1 || cr.Record.Outcome != cascade.OutcomeRunning || cr.Record.Counts.Cancelling != 1 {
		t.Fatalf("cancel: asks %v, %s %+v: want the one ask, running, 1 cancelling", cr.Asks, cr.Record.Outcome, cr.Record.Counts)
	}
	testenv.WaitFor(t, 30*time.Second, "the agent to stop and report", func() bool {
		rec, err := store.Plan(ctx, r.Plan)
		return err == nil && rec.Outcome == cascade.OutcomeCancelled
	})
	mods, err := store.Modules(ctx, r.Plan)
	if err != nil {
		t.Fatal(err)
	}
	if m := mods["slow"]; m.State != cascade.Cancelled || m.Reason != mesh.ReasonCancel || m.On != "m1" {
		t.Errorf("slow: %s reason %q on %q, want cancelled on the agent's failed{cancelled} from m1", m.State, m.Reason, m.On)
	}
	testenv.WaitFor(t, 5*time.Second, "the store's history", func() bool {
		return slices.Contains(states(), cascade.Cancelled)
	})
	got := states()
	// Queued may be overwritten by building within one batch; the rest
	// must come in order. Cancelling is what the cancel's answer said
	// (checked above); the store's history may not show it: the bucket
	// keeps one value per key, so a watcher that lags (two loaded cores
	// under -race: CI38) skips a value superseded before it was delivered,
	// and an agent that answers within the controller's batch lands in the
	// same write. What it must never show is anything after cancelled.
	var seq []cascade.ModuleState
	for _, st := range got {
		if st != cascade.Queued {
			seq = append(seq, st)
		}
	}
	if !slices.Equal(seq, []cascade.ModuleState{cascade.Building, cascade.Cancelling, cascade.Cancelled}) &&
		!slices.Equal(seq, []cascade.ModuleState{cascade.Building, cascade.Cancelled}) {
		t.Errorf("slow went %v, want queued/building → (cancelling →) cancelled", got)
	}
	n := 0
	builtEvents.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Errorf("%d built events after the cancel", n)
	}
}
