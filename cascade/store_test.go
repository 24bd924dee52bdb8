package cascade_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

func TestPruneKeepsRunningAndTheNewestSettledPlans(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if _, err := mesh.Raise(ctx, js, testenv.Catalogue(t, nil), 1); err != nil {
		t.Fatal(err)
	}
	st, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
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
