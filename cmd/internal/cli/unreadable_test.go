package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// A stored record that does not decode is named on stderr, with what to do;
// `builds plans`, `builds show` and `builds machines` show everything else
// and exit 0; `builds watch` stops, naming it.
func TestUnreadableRecordsAreNamedAndTheRestShown(t *testing.T) {
	s, st := cascadetest.PlanStore(t)
	ctx := context.Background()
	if err := st.Put(ctx, map[string]any{
		cascade.PlanKey("p1"): cascade.PlanRecord{ID: "p1", Outcome: cascade.OutcomeBuilt, Counts: cascade.Counts{Built: 2, Total: 2}},
		cascade.ModuleKey("p1", "base"): cascade.ModuleStatus{Module: "base", State: cascade.Built, On: "m1",
			Digest: "sha256:1111111111111111111111111111111111111111111111111111111111111111"},
	}); err != nil {
		t.Fatal(err)
	}
	_, js := natstest.Connect(t, s)
	kv, err := js.KeyValue(ctx, mesh.KVBucket("build-controller", cascade.StateBucket))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{cascade.PlanKey("p9"): "{oops", cascade.ModuleKey("p1", "app"): "[]"} {
		if _, err := kv.Put(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		args     []string
		out, bad string
	}{
		{[]string{"plans"}, "p1", cascade.PlanKey("p9")},
		{[]string{"show", "p1"}, "base", cascade.ModuleKey("p1", "app")},
		{[]string{"machines"}, "m1", cascade.ModuleKey("p1", "app")},
	} {
		code, out, errw := run(t, append([]string{"--nats", s.ClientURL()}, c.args...)...)
		if code != 0 || !strings.Contains(out, c.out) {
			t.Errorf("builds %s: exit %d, want 0 and %q shown:\n%s\n%s", strings.Join(c.args, " "), code, c.out, out, errw)
		}
		if !strings.Contains(errw, c.bad) || !strings.Contains(errw, "nats kv del") {
			t.Errorf("builds %s: stderr %q, want %s named with what to do", strings.Join(c.args, " "), errw, c.bad)
		}
	}
	// A watch cannot tell when a plan with a module it cannot read has
	// settled: it stops, naming it.
	bad := cascade.ModuleKey("p1", "app")
	if code, _, errw := run(t, "--nats", s.ClientURL(), "watch", "p1"); code == 0 || !strings.Contains(errw, bad) || !strings.Contains(errw, "nats kv del") {
		t.Errorf("builds watch p1: exit %d, stderr %q: want a failure naming %s with what to do", code, errw, bad)
	}
}
