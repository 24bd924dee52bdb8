package farm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// A farm whose NATS server started again on an empty store (its disk lost
// or replaced): before, the controller's work failed with the streams and
// the farm stopped ("the farm is failing: controller: the fleet: the watch
// of current images stopped"). Now it runs on: the controller raises the
// wire again, the machine's node enrols again and its build agent holds its
// seat again.
func TestAFarmWhoseNATSStoreWasLostRunsOn(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, _ := testenv.SmallFleet(t, "base")
	state := t.TempDir()
	f, err := Up(context.Background(), UpOptions{
		Catalogue: catalogue, StateDir: state, ListenNATS: "127.0.0.1:0", ListenRegistry: testenv.FreePorts(t, 1), Agents: 1,
		BuildkitdBin: testenv.BuildkitdBin(t), Log: testenv.Log(t, "farm"),
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	defer f.Stop()
	machine := f.Machines()[0]

	// The server stopped, its store removed, started again on the same
	// address, as an operator whose disk was replaced does.
	keys, err := creds.Ensure(CredsDir(state))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "nats")
	if _, err := f.restartNATS(dir, keys, testenv.Log(t, "nats"), func() error { return os.RemoveAll(dir) }); err != nil {
		t.Fatal(err)
	}

	nc, _, err := daemon.Connect(f.NATSURL(), f.OperatorCreds(), mesh.OperatorPrincipal, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	testenv.WaitFor(t, 90*time.Second, machine+" enrolled again and its build agent holding its seat", func() bool {
		select {
		case <-f.Failed():
			t.Fatalf("the farm failed: %v", f.Wait())
		default:
		}
		r, err := deploy.Call(ctx, nc, mesh.NodesTool, deploy.Request{})
		if err != nil {
			return false
		}
		enrolled := false
		for _, n := range r.Nodes {
			enrolled = enrolled || n.Node == machine
		}
		s, err := deploy.Call(ctx, nc, mesh.SeatsTool, deploy.Request{})
		if err != nil {
			return false
		}
		for _, st := range s.Seats {
			for _, c := range st.Claims {
				if st.Seat == mesh.BuildSeat && c.Node == machine {
					return enrolled
				}
			}
		}
		return false
	})
}
