package cascade_test

import (
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/cascade"
)

// WhyOf, on what a plan's state holds: a blocked module names the failed
// one; a module without a previous build is a first build; a platform
// change and a base that appeared are each named.
func TestWhyOfNamesWhatChanged(t *testing.T) {
	blocked := cascade.WhyOf("p1", false, cascade.ModuleStatus{Module: "app", State: cascade.Blocked, BlockedBy: "base"})
	if blocked.Verdict != "blocked" || blocked.BlockedBy != "base" || !strings.Contains(blocked.Summary, "base, which failed") {
		t.Errorf("blocked: %+v", blocked)
	}
	prev := &cascade.PreviousBuild{Plan: "p0", Digest: "sha256:aa", Inputs: &cascade.KeyInputs{Tree: "t1", Platform: "linux/amd64", Bases: map[string]string{"busybox": "sha256:b1"}}}
	now := &cascade.KeyInputs{Tree: "t1", Platform: "linux/arm64", Bases: map[string]string{"busybox": "sha256:b1", "runtime": "sha256:r1"}}
	w := cascade.WhyOf("p1", false, cascade.ModuleStatus{Module: "app", State: cascade.Built, Key: "k", Tree: "t1", Inputs: now, Previous: prev})
	if w.Verdict != "inputs changed" || len(w.Changes) != 2 || w.Changes[0].Input != "platform" || w.Changes[1].Input != "base runtime" || w.Changes[1].Old != "" {
		t.Errorf("changed: %+v", w)
	}
	if first := cascade.WhyOf("p1", false, cascade.ModuleStatus{Module: "app", State: cascade.Built, Key: "k", Tree: "t1", Inputs: now}); first.Verdict != "first build" {
		t.Errorf("first: %+v", first)
	}
}
