package farm

import (
	"context"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/mesh"

	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/internal/busybox"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/registry"
)

// TestUpRestartKeepsImages is issue 9's data loss, as an operator meets it:
// `builds up --state S`, an image pushed, the farm stopped and started again
// on the same state and registry address — the image a plan recorded as
// module@sha256:… still resolves, and so does its latest tag. And every
// machine's build agent runs again: its node resumes the declaration it
// applied (no new one comes), so each holds its machine's build seat.
func TestUpRestartKeepsImages(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	catalogue, _ := testenv.SmallFleet(t, "base")
	state, addr := t.TempDir(), testenv.FreePorts(t, 1)
	opts := UpOptions{
		Catalogue: catalogue, StateDir: state, ListenNATS: "127.0.0.1:0", ListenRegistry: addr,
		BuildkitdBin: testenv.BuildkitdBin(t), Log: testenv.Log(t, "farm"),
	}
	f, err := Up(ctx, opts)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	dgst, err := busybox.Push(ctx, f.RegistryAddr(), "base")
	if err != nil {
		f.Stop()
		t.Fatal(err)
	}
	if err := f.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}

	f, err = Up(ctx, opts)
	if err != nil {
		t.Fatalf("Up again on the same state: %v", err)
	}
	defer f.Stop()
	c := registry.NewClient()
	for _, ref := range []string{f.RegistryAddr() + "/base@" + dgst, f.RegistryAddr() + "/base:latest"} {
		if got, err := c.Identity(ctx, ref); err != nil || got != dgst { // the tag names the index with the attestations
			t.Errorf("after a restart, %s = %s, %v; want %s", ref, got, err, dgst)
		}
	}
	nc, _, err := daemon.Connect(f.NATSURL(), f.OperatorCreds(), mesh.OperatorPrincipal, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// `builds seats`: the controller reads who holds each seat.
	holds := func() map[string]bool {
		by := map[string]bool{}
		r, err := deploy.Call(ctx, nc, mesh.SeatsTool, deploy.Request{})
		if err != nil {
			return by
		}
		for _, s := range r.Seats {
			for _, c := range s.Claims {
				if s.Seat == mesh.BuildSeat {
					by[c.Node] = true
				}
			}
		}
		return by
	}
	for _, m := range f.Machines() {
		testenv.WaitFor(t, 30*time.Second, "after a restart, "+m+"'s build agent holding its build seat", func() bool { return holds()[m] })
	}
}
