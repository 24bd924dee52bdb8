package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// Retrying a module of a cancelled plan says the plan was cancelled and
// what to run instead. With the controller stopped, a push says that no
// controller answered and the push is queued (not a plan id to follow),
// and watching that plan says it is not made yet, not "no plan". A
// controller that holds its seat but does not answer (busy, fetching a big
// commit) is not taken for none: the push is not said queued.
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
	// Cancelled again, it says that nothing was left, not an empty list.
	if code, out, errw := run(t, "--nats", url, "cancel", plan); code != 0 || strings.Contains(out, "(asks )") {
		t.Errorf("a second cancel: exit %d\n%s\n%s", code, out, errw)
	} else {
		t.Logf("a second cancel: %s", strings.TrimSpace(out))
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

	// A controller that holds the seat, its tools there, answering
	// nothing (its loop busy). Its claim alone, no tools (a process gone,
	// its lease not yet lapsed), is taken for no controller.
	nc, js := natstest.Connect(t, s)
	lease, err := claim.Claim(context.Background(), js, mesh.ControllerSeat, claim.Mesh(), "build-controller on busy pid 7")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	code, out, _ = run(t, "--nats", url, "push", "--repo", "https://git.example/fleet.git", "--commit", "cafe", "--path", "base/Dockerfile")
	if code != 0 || !strings.Contains(out, "is not made yet: no controller answered, so the push is queued") {
		t.Errorf("push with the seat held and no tools: exit %d\n%s\nwant it queued", code, out)
	}
	sub, err := nc.SubscribeSync(mesh.ModuleToolSubject("build-controller", cascade.ToolRetry))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	code, out, errw = run(t, "--nats", url, "push", "--repo", "https://git.example/fleet.git", "--commit", "beef", "--path", "base/Dockerfile")
	if code != 0 || strings.Contains(out, "no controller answered") || !strings.Contains(out, "(follow it: builds watch") ||
		!strings.Contains(out, "the controller (build-controller on busy pid 7) has not answered in 3s: it is busy") {
		t.Errorf("push with a busy controller: exit %d\nstdout %s\nstderr %s\nwant it not queued, the plan to follow, and why it has not come", code, out, errw)
	}
	t.Logf("push, busy controller: stderr %q stdout %q", errw, out)
}
