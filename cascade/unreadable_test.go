package cascade_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/seat"
)

// Stored records that do not decode (written by hand, or by another
// version) are named in the controller's log and left as they are; they
// stop nothing else. A controller restarted over a plan record, a module's
// record, a current image and an estimate of that kind resumes the running
// plan, builds each module once, and writes the module's record and the
// estimate again; the store's reads name the rest and return every other
// record.
func TestUnreadableStoredRecordsAreNamedAndLeft(t *testing.T) {
	ctx := context.Background()
	graph := map[string][]string{"a": nil, "b": {"a"}, "c": {"b"}}
	h := newHarness(t, graph, 1)
	for m := range graph {
		h.w.sleep[m] = 300 * time.Millisecond
	}
	plan := h.push("c1", "push-c1")
	testenv.WaitFor(t, 10*time.Second, "b to be asked for", func() bool { return len(h.w.asksOf("b")) == 1 })
	h.stopControllerNow()

	kv, err := seat.OpenBucket(ctx, h.js, "build-controller", cascade.StateBucket)
	if err != nil {
		t.Fatal(err)
	}
	garbage := map[string]string{
		cascade.PlanKey("p-garbage"):  "{not json",
		cascade.ModuleKey(plan, "c"):  "\x00\x01",
		cascade.CurrentKey("zz"):      "[1,2",
		cascade.EstimateKey("a"):      `"soon"`,
		cascade.InputKeyKey("k-junk"): "17",
	}
	for k, v := range garbage {
		if _, err := kv.PutString(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	var logs testenv.Buffer
	h.log = slog.New(slog.NewTextHandler(&logs, nil))
	h.startController()

	rec, _ := h.settle(plan, 20*time.Second)
	if rec.Outcome != cascade.OutcomeBuilt || rec.Counts.Built != 3 {
		t.Fatalf("plan %+v, want its three modules built", rec)
	}
	for m := range graph {
		if n := len(h.w.asksOf(m)); n != 1 {
			t.Errorf("%s worked %d times, want once", m, n)
		}
	}
	for k := range garbage {
		if k == cascade.ModuleKey(plan, "c") {
			continue // written again when c was built
		}
		if !strings.Contains(logs.String(), k) {
			t.Errorf("the controller's log does not name %s:\n%s", k, logs.String())
		}
		if k == cascade.EstimateKey("a") {
			continue // written again from a's built, replayed
		}
		e, err := kv.Get(ctx, k)
		if err != nil || string(e.Value()) != garbage[k] {
			t.Errorf("%s: %v, want it left as it was", k, err)
		}
	}
	recs, err := h.store().Plans(ctx)
	var ue *cascade.UnreadableError
	if !errors.As(err, &ue) || !slices.Equal(ue.Keys, []string{cascade.PlanKey("p-garbage")}) {
		t.Fatalf("reading the plans: %v, want the unreadable record named", err)
	}
	if !strings.Contains(err.Error(), "nats kv del") {
		t.Errorf("the error says nothing of what to do: %v", err)
	}
	if len(recs) != 1 || recs[0].ID != plan {
		t.Errorf("plans read %+v, want %s beside the unreadable one", recs, plan)
	}
}
