package cascade_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/registry"
)

// TestUnchangedInputsAreNotDispatchedAndTheCascadeStops runs a controller
// that keeps its own clones, and two agents on two buildkitd daemons (no
// shared daemon), on base → app → tool (base on busybox, outside the plans)
// against a real registry and git repository:
//
//   - the first rebuild builds all three, every ask carrying an input key;
//   - a rebuild with nothing changed dispatches nothing: all three settle
//     unchanged at once, reusing the first plan's digests;
//   - a push touching base/README.md (a file base's Dockerfile never
//     copies) rebuilds base, which comes out with the digest it had, and app
//     and tool settle unchanged (early cutoff);
//   - a push changing base/motd (copied) rebuilds base with a new digest,
//     and everything downstream is built again;
//   - rebuild --force dispatches every module whatever its key.
func TestUnchangedInputsAreNotDispatchedAndTheCascadeStops(t *testing.T) {
	bed := cascadetest.RealBed(t, map[string]string{
		"base/Dockerfile": "FROM busybox\nCOPY motd /etc/motd\nRUN echo base > /base\n",
		"base/motd":       "hello\n",
		"base/README.md":  "the base image\n",
		"app/Dockerfile":  "FROM base\nCOPY app.txt /app.txt\n",
		"app/app.txt":     "app\n",
		"tool/Dockerfile": "FROM app\nRUN cat /etc/motd /app.txt > /tool\n",
	}, map[string][]string{"busybox": nil, "base": {"busybox"}, "app": {"base"}, "tool": {"app"}})
	git, nc, js, ctx, wg := bed.Git, bed.NC, bed.JS, bed.Ctx, bed.WG
	bks := []string{testenv.Buildkitd(t, bed.Reg), testenv.Buildkitd(t, bed.Reg)}

	cfg := cascade.DefaultConfig()
	cfg.Registry, cfg.RegistryClient = bed.Reg, registry.NewClient(registry.WithInsecure(true))
	cfg.Sources, cfg.InsteadOf = t.TempDir(), map[string]string{meshtest.FleetRepo: git}
	startController := func() (stop func()) {
		t.Helper()
		c, err := cascade.New(cfg, js, bed.Cat, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		wg.Go(func() {
			defer close(done)
			if err := c.Run(cctx); err != nil {
				t.Errorf("controller: %v", err)
			}
		})
		cascadetest.WaitReady(t, nc, c.Module(), 10*time.Second)
		return func() { cancel(); <-done }
	}
	stopController := startController()
	for i, bk := range bks {
		bed.Agent(t, bk, []string{"m1", "m2"}[i])
	}

	// Every ask published, by plan: what was dispatched.
	var mu sync.Mutex
	asks := map[string][]mesh.Ask{}
	sub, err := nc.Subscribe(mesh.SeatAcceptAll(mesh.BuildSeat), func(m *nats.Msg) {
		if a, err := mesh.DecodeAsk(m.Data); err == nil {
			mu.Lock()
			asks[a.Plan] = append(asks[a.Plan], a)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	dispatched := func(plan string) (mods []string, keys int) {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range asks[plan] {
			mods = append(mods, a.Module)
			if len(a.Key) == 64 {
				keys++
			}
		}
		return mods, keys
	}

	d := newPlanDriver(t, bed, "build-controller")
	store, rebuild, push := d.store, d.rebuild, d.push
	wantStates := func(plan string, mods map[string]cascade.ModuleStatus, want map[string]cascade.ModuleState) {
		t.Helper()
		for m, st := range want {
			if mods[m].State != st {
				t.Errorf("plan %s: %s is %s, want %s", plan, m, mods[m].State, st)
			}
		}
	}

	// 1. Everything built, on two daemons; every ask keyed.
	first := rebuild("first", false)
	wantStates("r-first", first, map[string]cascade.ModuleState{"base": cascade.Built, "app": cascade.Built, "tool": cascade.Built})
	if mods, keys := dispatched("r-first"); len(mods) != 3 || keys != 3 {
		t.Fatalf("first plan dispatched %v with %d keys, want 3 asks each with a key", mods, keys)
	}
	why := func(plan string, forced bool, m cascade.ModuleStatus, verdict string) cascade.Why {
		t.Helper()
		w := cascade.WhyOf(plan, forced, m)
		if w.Verdict != verdict {
			t.Errorf("why %s in %s: %s (%s), want %s", m.Module, plan, w.Verdict, w.Summary, verdict)
		}
		return w
	}
	why("r-first", false, first["base"], "first build")

	// 2. Nothing changed: nothing dispatched, all unchanged, reusing.
	again := rebuild("again", false)
	wantStates("r-again", again, map[string]cascade.ModuleState{"base": cascade.Unchanged, "app": cascade.Unchanged, "tool": cascade.Unchanged})
	for m, st := range again {
		if st.Reuses != "r-first" || st.Digest != first[m].Digest {
			t.Errorf("again: %s reuses %q at %s, want r-first's %s", m, st.Reuses, st.Digest, first[m].Digest)
		}
	}
	if w := why("r-again", false, again["app"], "unchanged"); w.Reuses != "r-first" || !strings.Contains(w.Summary, "plan r-first built") {
		t.Errorf("why app unchanged: %+v", w)
	}
	if mods, _ := dispatched("r-again"); len(mods) != 0 {
		t.Fatalf("nothing changed, dispatched %v", mods)
	}
	if rec, _ := store.Plan(ctx, "r-again"); rec.Counts.Unchanged != 3 || rec.Counts.Built != 0 {
		t.Errorf("r-again counts %+v, want 3 unchanged", rec.Counts)
	}

	// 3. A README in base's context: base rebuilt to the same digest, the
	// cascade stops there.
	readme, mods := push(map[string]string{"base/README.md": "the base image, documented\n"})
	wantStates(readme, mods, map[string]cascade.ModuleState{"base": cascade.Built, "app": cascade.Unchanged, "tool": cascade.Unchanged})
	if mods["base"].Digest != first["base"].Digest {
		t.Errorf("base rebuilt for a README: %s, want the digest it had, %s", mods["base"].Digest, first["base"].Digest)
	}
	if w := why(readme, false, mods["base"], "inputs changed"); len(w.Changes) != 1 || w.Changes[0].Input != "context" || !slices.Equal(w.Changes[0].Paths, []string{"README.md"}) {
		t.Errorf("why base after a README push: %+v, want its context changed in README.md", w.Changes)
	}
	if got, _ := dispatched(readme); len(got) != 1 || got[0] != "base" {
		t.Errorf("a README dispatched %v, want base alone", got)
	}

	// 4. A change base's image carries: everything downstream rebuilds.
	motd, mods := push(map[string]string{"base/motd": "hello again\n"})
	wantStates(motd, mods, map[string]cascade.ModuleState{"base": cascade.Built, "app": cascade.Built, "tool": cascade.Built})
	for _, m := range []string{"base", "app", "tool"} {
		if mods[m].Digest == first[m].Digest {
			t.Errorf("after base/motd changed, %s kept digest %s", m, mods[m].Digest)
		}
	}
	if w := why(motd, false, mods["base"], "inputs changed"); len(w.Changes) != 1 || !slices.Equal(w.Changes[0].Paths, []string{"motd"}) {
		t.Errorf("why base after motd changed: %+v", w.Changes)
	}
	if w := why(motd, false, mods["app"], "inputs changed"); len(w.Changes) != 1 || w.Changes[0].Input != "base base" ||
		w.Changes[0].Old != first["base"].Digest || w.Changes[0].New != mods["base"].Digest {
		t.Errorf("why app after base changed: %+v, want base %s → %s", w.Changes, first["base"].Digest, mods["base"].Digest)
	}

	// 5. Forced: every module dispatched, whatever its key.
	forced := rebuild("forced", true)
	wantStates("r-forced", forced, map[string]cascade.ModuleState{"base": cascade.Built, "app": cascade.Built, "tool": cascade.Built})
	why("r-forced", true, forced["tool"], "forced")
	if got, _ := dispatched("r-forced"); len(got) != 3 {
		t.Errorf("forced dispatched %v, want all three", got)
	}
	// Reproducible: built again on whichever daemon, the same digests.
	for m, st := range forced {
		if st.Digest != mods[m].Digest {
			t.Errorf("forced %s: %s, the push before built %s", m, st.Digest, mods[m].Digest)
		}
	}

	// 6. A restarted controller knows the keys from its bucket: nothing
	// changed since the forced plan, so nothing is dispatched.
	stopController()
	stopController = startController()
	defer stopController()
	restarted := rebuild("restarted", false)
	wantStates("r-restarted", restarted, map[string]cascade.ModuleState{"base": cascade.Unchanged, "app": cascade.Unchanged, "tool": cascade.Unchanged})
	if got, _ := dispatched("r-restarted"); len(got) != 0 || restarted["tool"].Reuses != "r-forced" {
		t.Errorf("after a restart: dispatched %v, tool reuses %q; want nothing, reusing r-forced", got, restarted["tool"].Reuses)
	}
}
