package planview

import (
	"bytes"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/cascade"
)

// A superseded module is a result, as an unchanged one is: counted and
// shown with the plan that superseded it. A held module says what it
// waits behind; a running plan says its priority, owner and cap.
func TestPrintPlanShowsSupersededAndHeld(t *testing.T) {
	rec := cascade.PlanRecord{ID: "p-old", Outcome: cascade.OutcomeRunning, Priority: 3, Owner: "https://git.example/fleet", Cap: 4,
		Held:   "capped at 4 machines",
		Counts: cascade.Counts{Built: 1, Superseded: 2, Ready: 1, Total: 4}}
	mods := map[string]cascade.ModuleStatus{
		"base": {Module: "base", State: cascade.Built, Digest: "sha256:0123456789abcdef"},
		"a":    {Module: "a", Tier: 1, State: cascade.Superseded, SupersededBy: "p-new"},
		"b":    {Module: "b", Tier: 1, State: cascade.Superseded, SupersededBy: "p-new"},
		"c":    {Module: "c", Tier: 1, State: cascade.Ready},
	}
	var b bytes.Buffer
	PrintPlan(&b, rec, mods)
	out := b.String()
	for _, want := range []string{
		"  priority 3, owner https://git.example/fleet, cap 4\n",
		"4 modules: 1 built, 2 superseded, 1 waiting",
		"  a     superseded  -  -  superseded by p-new\n",
		"  c     waiting     -  -  waiting: capped at 4 machines\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("PrintPlan lacks %q:\n%s", want, out)
		}
	}
}
