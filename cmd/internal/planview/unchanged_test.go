package planview

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
)

// An unchanged module shows its state, the digest it reuses and the plan
// that built it; the counts say how many were unchanged.
func TestPrintPlanShowsUnchangedAndThePlanReused(t *testing.T) {
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := cascade.PlanRecord{
		ID: "p-0123456789ab", Summary: "push https://git.example/fleet.git@1a2b3c4, changed base/README.md",
		Outcome: cascade.OutcomeBuilt, Counts: cascade.Counts{Built: 1, Unchanged: 1, Total: 2},
		Created: created, Finished: created.Add(2 * time.Second),
	}
	mods := map[string]cascade.ModuleStatus{
		"base":    {Module: "base", Tier: 0, State: cascade.Built, On: "m-a1", Duration: 1500 * time.Millisecond, Digest: "sha256:0123456789abcdef"},
		"runtime": {Module: "runtime", Tier: 1, State: cascade.Unchanged, Digest: "sha256:fedcba9876543210", Reuses: "p-aaaaaaaaaaaa"},
	}
	var b bytes.Buffer
	PrintPlan(&b, rec, mods)
	want := `plan p-0123456789ab  built  push https://git.example/fleet.git@1a2b3c4, changed base/README.md
  2 modules: 1 built, 1 unchanged in 2s
tier 0
  base     built      m-a1  1.5s  0123456789ab
tier 1
  runtime  unchanged  -        -  fedcba987654  reuses p-aaaaaaaaaaaa
machines
  m-a1  1 built  1.5s
`
	if b.String() != want {
		t.Errorf("PrintPlan:\n%s\nwant:\n%s", b.String(), want)
	}
}

// A plan whose every module is unchanged settles the moment it is made:
// its summary says so rather than "in -".
func TestPrintPlanOfNothingBuiltSaysItSettledAtOnce(t *testing.T) {
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := cascade.PlanRecord{ID: "r-1", Summary: "rebuild base", Outcome: cascade.OutcomeBuilt,
		Counts: cascade.Counts{Unchanged: 1, Total: 1}, Created: created, Finished: created.Add(3 * time.Millisecond)}
	var b bytes.Buffer
	PrintPlan(&b, rec, map[string]cascade.ModuleStatus{"base": {Module: "base", State: cascade.Unchanged, Digest: "sha256:0123456789abcdef", Reuses: "p-0"}})
	if !strings.Contains(b.String(), "  1 modules: 1 unchanged, settled at once\n") {
		t.Errorf("PrintPlan:\n%s\nwant its summary to say it settled at once", b.String())
	}
}
