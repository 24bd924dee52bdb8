package cascade_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
)

func TestPruneKeepsRunningAndTheNewestSettledPlans(t *testing.T) {
	st := cascadetest.Store(t)
	ctx := context.Background()
	outcomes := []cascade.Outcome{cascade.OutcomeBuilt, cascade.OutcomeRunning, cascade.OutcomeFailed, cascade.OutcomeBuilt, cascade.OutcomeEmpty, cascade.OutcomeBuilt}
	for i, o := range outcomes {
		id := fmt.Sprintf("p-%d", i)
		rec := cascade.PlanRecord{ID: id, Seq: uint64(i + 1), Outcome: o, Created: time.Now(), Trigger: planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: id}}
		if _, err := st.CreatePlan(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if err := st.Put(ctx, map[string]any{cascade.ModuleKey(id, "a"): cascade.ModuleStatus{Module: "a"}}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := st.Prune(ctx, 2)
	if err != nil || n != 3 {
		t.Fatalf("pruned %d (%v), want 3", n, err)
	}
	recs, err := st.Plans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	if fmt.Sprint(ids) != "[p-5 p-4 p-1]" {
		t.Fatalf("kept %v, want the two newest settled and the running one", ids)
	}
	if mods, _ := st.Modules(ctx, "p-0"); len(mods) != 0 {
		t.Errorf("a pruned plan's modules are left: %v", mods)
	}
	if mods, _ := st.Modules(ctx, "p-1"); len(mods) != 1 {
		t.Errorf("the running plan's modules are gone")
	}
}

// Input keys go with the plans that built them, but for those a kept plan
// or a module's current image still refers to.
func TestPruneKeysGoWithTheirPlans(t *testing.T) {
	st := cascadetest.Store(t)
	ctx := context.Background()
	dg := func(n int) string { return fmt.Sprintf("sha256:%064d", n) }
	// p-0 and p-2 are pruned (keep 2 settled: p-3, p-4); p-1 runs.
	outcomes := []cascade.Outcome{cascade.OutcomeBuilt, cascade.OutcomeRunning, cascade.OutcomeFailed, cascade.OutcomeBuilt, cascade.OutcomeBuilt}
	for i, o := range outcomes {
		id := fmt.Sprintf("p-%d", i)
		rec := cascade.PlanRecord{ID: id, Seq: uint64(i + 1), Outcome: o, Created: time.Now(), Trigger: planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: id}}
		if _, err := st.CreatePlan(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	values := map[string]any{
		// Built by a pruned plan, referred to by nothing: goes.
		cascade.InputKeyKey("k-old"): cascade.KeyRecord{Module: "a", Digest: dg(1), Plan: "p-0"},
		// Built by a pruned plan to b's current image: stays.
		cascade.InputKeyKey("k-current"): cascade.KeyRecord{Module: "b", Digest: dg(2), Plan: "p-0"},
		cascade.CurrentKey("b"):          cascade.Current{Module: "b", Digest: dg(2), Plan: "p-0", Seq: 1},
		// Built by a pruned plan to an image b is no longer at: goes.
		cascade.InputKeyKey("k-was-current"): cascade.KeyRecord{Module: "b", Digest: dg(3), Plan: "p-2"},
		// Built by a pruned plan, reused (settled unchanged) by a kept one: stays.
		cascade.InputKeyKey("k-reused"):  cascade.KeyRecord{Module: "c", Digest: dg(4), Plan: "p-2"},
		cascade.ModuleKey("p-4", "c"):    cascade.ModuleStatus{Module: "c", Key: "k-reused", State: cascade.Unchanged, Digest: dg(4)},
		cascade.ModuleKey("p-0", "c"):    cascade.ModuleStatus{Module: "c", Key: "k-pruned-plan-module"},
		cascade.InputKeyKey("k-kept"):    cascade.KeyRecord{Module: "d", Digest: dg(5), Plan: "p-3"},
		cascade.InputKeyKey("k-running"): cascade.KeyRecord{Module: "e", Digest: dg(6), Plan: "p-1"},
		// Its plan was pruned before keys were: goes.
		cascade.InputKeyKey("k-orphan"): cascade.KeyRecord{Module: "f", Digest: dg(7), Plan: "p-gone"},
	}
	if err := st.Put(ctx, values); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Prune(ctx, 2); err != nil || n != 2 {
		t.Fatalf("pruned %d plans (%v), want 2", n, err)
	}
	removed, err := st.PruneKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var gone []string
	for k := range removed {
		gone = append(gone, k)
	}
	slices.Sort(gone)
	if fmt.Sprint(gone) != "[k-old k-orphan k-was-current]" {
		t.Errorf("PruneKeys removed %v, want [k-old k-orphan k-was-current]", gone)
	}
	if r := removed["k-old"]; r.Plan != "p-0" || r.Module != "a" {
		t.Errorf("removed k-old is reported as %+v", r)
	}
	keys, err := st.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for k := range keys {
		left = append(left, k)
	}
	slices.Sort(left)
	if fmt.Sprint(left) != "[k-current k-kept k-reused k-running]" {
		t.Errorf("the bucket keeps %v, want [k-current k-kept k-reused k-running]", left)
	}
	// Again: nothing more goes.
	if again, err := st.PruneKeys(ctx); err != nil || len(again) != 0 {
		t.Errorf("a second PruneKeys removed %v (%v), want nothing", again, err)
	}
}

// Plans and Modules list every plan and module that exists while the
// controller rewrites them: the read `builds plans` makes of a busy store
// (a running plan once went missing from it, its record rewritten as the
// listing reached it).
func TestListingsWhileTheStoreIsWritten(t *testing.T) {
	st := cascadetest.Store(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const plans, mods = 40, 30
	for i := range plans {
		id := fmt.Sprintf("p-%02d", i)
		rec := cascade.PlanRecord{ID: id, Seq: uint64(i + 1), Outcome: cascade.OutcomeRunning, Created: time.Now(), Trigger: planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: id}}
		if _, err := st.CreatePlan(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	for j := range mods {
		if err := st.Put(ctx, map[string]any{cascade.ModuleKey("p-00", fmt.Sprintf("m-%02d", j)): cascade.ModuleStatus{Module: fmt.Sprintf("m-%02d", j), State: cascade.Waiting}}); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the controller: every record and module written again and again
		defer close(done)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("p-%02d", n%plans)
			rec := cascade.PlanRecord{ID: id, Seq: uint64(n%plans + 1), Outcome: cascade.OutcomeRunning, Created: time.Now(), Counts: cascade.Counts{Building: n}}
			m := fmt.Sprintf("m-%02d", (n*7)%mods)
			if err := st.Put(ctx, map[string]any{cascade.PlanKey(id): rec, cascade.ModuleKey("p-00", m): cascade.ModuleStatus{Module: m, State: cascade.Building}}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for i := range 30 {
		recs, err := st.Plans(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != plans {
			t.Fatalf("listing %d: %d plans of %d", i, len(recs), plans)
		}
		ms, err := st.Modules(ctx, "p-00")
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != mods {
			t.Fatalf("listing %d: %d modules of %d", i, len(ms), mods)
		}
	}
}

// A few plans of a big catalogue fill the plans bucket (64 MiB) long before
// KeepPlans of them do: Prune also removes the oldest settled plans while
// the bucket holds more than half its limit — never the newest settled one
// nor a running one. On a real server, the bucket's limit lowered to 1 MiB.
func TestPruneKeepsThePlansBucketUnderHalfItsLimit(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if _, err := mesh.Raise(ctx, js, meshtest.Catalogue(t, nil), 1); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, mesh.KVStream(mesh.KVBucket("build-controller", cascade.StateBucket)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.MaxBytes = 1 << 20
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	st, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 2000)
	for i := range 8 { // 8 plans of some 80 KB: 640 KB
		id := fmt.Sprintf("p-%d", i)
		o := cascade.OutcomeBuilt
		if i == 3 {
			o = cascade.OutcomeRunning
		}
		rec := cascade.PlanRecord{ID: id, Seq: uint64(i + 1), Outcome: o, Created: time.Now(), Trigger: planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: id}}
		if _, err := st.CreatePlan(ctx, rec); err != nil {
			t.Fatal(err)
		}
		mods := map[string]any{}
		for m := range 40 {
			mods[cascade.ModuleKey(id, fmt.Sprintf("m%d", m))] = cascade.ModuleStatus{Module: fmt.Sprintf("m%d", m), Message: big}
		}
		if err := st.Put(ctx, mods); err != nil {
			t.Fatal(err)
		}
	}
	n, err := st.Prune(ctx, cascade.DefaultKeepPlans)
	if err != nil || n == 0 {
		t.Fatalf("pruned %d (%v), want the oldest plans gone", n, err)
	}
	status, err := st.KV().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status.Bytes() > 1<<19 {
		t.Errorf("the bucket holds %d bytes after pruning, more than half its limit", status.Bytes())
	}
	recs, err := st.Plans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]bool{}
	for _, r := range recs {
		kept[r.ID] = true
	}
	if !kept["p-7"] || !kept["p-3"] || kept["p-0"] || len(recs) != 8-n {
		t.Errorf("kept %v after pruning %d; want the newest settled (p-7) and the running (p-3), not the oldest", slices.Sorted(maps.Keys(kept)), n)
	}
	if mods, _ := st.Modules(ctx, "p-3"); len(mods) != 40 {
		t.Errorf("the running plan has %d modules left, want 40", len(mods))
	}
}
