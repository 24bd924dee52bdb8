package cascade_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/state"
)

// TestPlanStoreKeepsTheStateLimits: the controller's own plan store goes
// through the limit every module's state does — a value over 256 KiB is
// refused naming the limit, and nothing is written.
func TestPlanStoreKeepsTheStateLimits(t *testing.T) {
	st := cascadetest.Store(t)
	ctx := context.Background()
	huge := cascade.ModuleStatus{Module: "a", Bases: []string{strings.Repeat("b", mesh.BucketMaxValue)}}
	err := st.Put(ctx, map[string]any{cascade.ModuleKey("p", "a"): huge})
	if !errors.Is(err, state.ErrValueTooLarge) || !strings.Contains(err.Error(), "256 KiB a value") || !strings.Contains(err.Error(), cascade.ModuleKey("p", "a")) {
		t.Fatalf("a module status over 256 KiB: %v, want ErrValueTooLarge naming the key and the limit", err)
	}
	if _, err := st.KV().Get(ctx, cascade.ModuleKey("p", "a")); err == nil {
		t.Fatal("the refused value was written")
	}
	if err := st.Put(ctx, map[string]any{cascade.ModuleKey("p", "a"): cascade.ModuleStatus{Module: "a"}}); err != nil {
		t.Fatalf("an ordinary status: %v", err)
	}
}
