package cli_test

import (
	"strings"
	"testing"
)

// Retrying a module of a cancelled plan says the plan was cancelled and
// what to run instead. With the controller stopped, a push says that no
// controller answered and the push is queued (not a plan id to follow),
// and watching that plan says it is not made yet, not "no plan".
func TestMessagesOfACancelledPlanAndOfAPushNobodyPlans(t *testing.T) {
	s, _, stop := runFleetController(t)
	url := s.ClientURL()

	code, out, errw := run(t, "--nats", url, "rebuild", "--id", "c1", "base")
	if code != 0 {
		t.Fatalf("rebuild base: exit %d\n%s\n%s", code, out, errw)
	}
	plan := strings.TrimSuffix(strings.Fields(out)[1], ":")
	if code, out, errw := run(t, "--nats", url, "cancel", plan); code != 0 {
		t.Fatalf("cancel: exit %d\n%s\n%s", code, out, errw)
	}
	code, _, errw = run(t, "--nats", url, "retry", plan, "base")
	if code != 1 || !strings.Contains(errw, "plan "+plan+" was cancelled") || !strings.Contains(errw, "builds rebuild base") {
		t.Errorf("retry in a cancelled plan: exit %d, %q; want it cancelled, and the next step", code, errw)
	}

	// The controller stops.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	code, out, errw = run(t, "--nats", url, "push", "--repo", "https://git.example/fleet.git", "--commit", "d00d", "--path", "base/Dockerfile")
	if code != 0 || !strings.Contains(out, "is not made yet: no controller answered, so the push is queued") || strings.Contains(out, "(follow it: builds watch") {
		t.Fatalf("push with no controller: exit %d\n%s\n%s", code, out, errw)
	}
	queued := strings.Fields(out)[1]
	code, _, errw = run(t, "--nats", url, "watch", queued)
	if code != 1 || !strings.Contains(errw, "plan "+queued+" is not made yet: no controller answered") || strings.Contains(errw, "no plan "+queued) {
		t.Errorf("watch of the queued push: exit %d, %q; want 'not made yet', not 'no plan'", code, errw)
	}
	t.Logf("push: %s", strings.TrimSpace(out))
	t.Logf("watch: %s", strings.TrimSpace(errw))
}
