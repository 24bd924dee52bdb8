package daemon

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
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
	var clog testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	cdone := make(chan error, 1)
	go func() {
		cdone <- RunController(ctx, ControllerOptions{NATS: c.URLs(), Catalogue: dir, Poll: time.Hour, Lease: 3 * time.Second,
			Controller: cascade.Config{Registry: "127.0.0.1:1", Images: testenv.AnyImage{}, Replicas: 3}, Ready: ready, Log: slog.New(slog.NewTextHandler(&clog, nil))})
	}()
	select {
	case <-ready:
	case err := <-cdone:
		t.Fatalf("controller: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("the controller did not start")
	}
	_, js := c.Connect(t)
	data, _ := json.Marshal(mesh.Pushed{Version: 1, Repo: meshtest.FleetRepo, Commit: "c1", At: time.Now().UTC()})
	if _, err := js.Publish(ctx, mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data); err != nil {
		t.Fatal(err)
	}
	id := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: meshtest.FleetRepo, Commit: "c1"})
	testenv.WaitFor(t, 30*time.Second, "the push planned", func() bool { return strings.Contains(clog.String(), id) })
	for round := range 1 {
		for i := range 3 {
			c.Stop(i)
		}
		time.Sleep(5 * time.Second)
		for i := range 3 {
			c.Restart(i)
		}
		testenv.WaitFor(t, 90*time.Second, "the controller running again", func() bool {
			return strings.Count(clog.String(), "controller running") >= round+2
		})
	}
	time.Sleep(2 * wireRelook)
	select {
	case err := <-cdone:
		t.Fatalf("the controller stopped: %v", err)
	default:
	}
	if strings.Contains(clog.String(), "lost the farm's streams") {
		t.Errorf("a cluster restart taken for a wipe:\n%s", clog.String())
	}
}
