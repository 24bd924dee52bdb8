package demo

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/cascade"
)

// A plan that is not built names each failed module and why.
func TestNotBuilt(t *testing.T) {
	rec := cascade.PlanRecord{ID: "p-0123456789ab", Outcome: cascade.OutcomeFailed}
	mods := map[string]cascade.ModuleStatus{
		"base":    {Module: "base", State: cascade.Built},
		"tool-01": {Module: "tool-01", State: cascade.Failed, Reason: "build", Message: "RUN exit code: 3\nmore"},
		"tool-02": {Module: "tool-02", State: cascade.Blocked, BlockedBy: "tool-01"},
	}
	err := notBuilt(rec, mods)
	if !errors.Is(err, ErrPlanNotBuilt) || !strings.Contains(err.Error(), "tool-01 (build: RUN exit code: 3)") {
		t.Errorf("notBuilt = %v", err)
	}
}
