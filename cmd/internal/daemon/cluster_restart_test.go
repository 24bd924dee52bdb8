package daemon

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
)

// A three-server cluster stopped whole and started again, the controller's
// lease lapsing meanwhile, is not taken for a bus that lost its store: while
// it recovers, its streams may be looked for before they are loaded, and a
// controller that started over on that would plan again what the store
// still holds. It takes its seat back and resumes, saying nothing of a
// lost wire.
func TestAClusterStartedAgainWholeIsNotTakenForALostStore(t *testing.T) {
	c := natstest.Cluster(t, 3)
	dir := chainCatalogue(t)
	ctl := startStandbyController(t, c.URLs(), dir, 3*time.Second, func(o *ControllerOptions) { o.Controller.Replicas = 3 })
	ctl.awaitReady(t, 90*time.Second)
	ctx := context.Background()
	_, js := c.Connect(t)
	data, _ := json.Marshal(mesh.Pushed{Version: 1, Repo: meshtest.FleetRepo, Commit: "c1", At: time.Now().UTC()})
	if _, err := js.Publish(ctx, mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data); err != nil {
		t.Fatal(err)
	}
	id := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: meshtest.FleetRepo, Commit: "c1"})
	testenv.WaitFor(t, 30*time.Second, "the push planned", func() bool { return strings.Contains(ctl.log.String(), id) })
	// Stopped whole for longer than the lease (3 s), then started again.
	for i := range 3 {
		c.Stop(i)
	}
	time.Sleep(5 * time.Second)
	for i := range 3 {
		c.Restart(i)
	}
	testenv.WaitFor(t, 90*time.Second, "the controller running again", func() bool {
		return strings.Count(ctl.log.String(), "controller running") >= 2
	})
	time.Sleep(2 * wireRelook)
	select {
	case err := <-ctl.done:
		t.Fatalf("the controller stopped: %v", err)
	default:
	}
	if strings.Contains(ctl.log.String(), "lost the farm's streams") {
		t.Errorf("a cluster restart taken for a wipe:\n%s", ctl.log.String())
	}
}
