package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/state"
)

// TestModuleStateIsLiveAcrossNodes (ADR 0201's live check): the owner of a
// bucket puts on one node and a reader's watch on another node sees it; a
// node assigned afterwards reads the value at start; a module out of
// process on a third node writes through its socket, which is served only
// while it is assigned. Every node runs as the principal its assignment
// derives, on a server that enforces it.
func TestModuleStateIsLiveAcrossNodes(t *testing.T) {
	ms := append(meshtest.MeshManifests(t),
		&mesh.Manifest{Module: "owner", State: []mesh.Bucket{{Name: "builds"}}},
		&mesh.Manifest{Module: "reader", Reads: []string{"owner.builds"}},
	)
	if ps := mesh.Check(ms); mesh.HasErrors(ps) {
		t.Fatal(ps)
	}
	cat := mesh.NewCatalogue(ms)
	b := newBedWith(t, cat,
		cat.NodeStatePermissions("n1", []string{"owner"}),
		cat.NodeStatePermissions("n2", []string{"reader"}),
		cat.NodeStatePermissions("n3", []string{"reader"}),
		cat.NodeStatePermissions("n4", []string{"owner"}))
	b.controller(deploy.DefaultControllerConfig())

	// owner, carried on n1: puts once it runs.
	put := make(chan error, 1)
	owner := func(ctx context.Context) error {
		st, ok := state.FromContext(ctx)
		if !ok {
			put <- context.Canceled
			return nil
		}
		_, err := st.Put(ctx, "builds", "greeting", []byte(`{"from":"n1"}`))
		put <- err
		<-ctx.Done()
		return nil
	}
	// reader, carried on n2 and n3: watches, sending every event.
	events := map[string]chan state.Event{"n2": make(chan state.Event, 16), "n3": make(chan state.Event, 16)}
	reader := func(node string) deploy.RunFunc {
		return func(ctx context.Context) error {
			st, _ := state.FromContext(ctx)
			w, err := st.Watch(ctx, "owner.builds")
			if err != nil {
				return err
			}
			defer w.Stop()
			for e := range w.Events() {
				events[node] <- e
			}
			return nil
		}
	}
	next := func(node string) state.Event {
		t.Helper()
		select {
		case e := <-events[node]:
			return e
		case <-time.After(20 * time.Second):
			t.Fatalf("%s's reader saw nothing in 20s", node)
		}
		return state.Event{}
	}

	n2, _ := b.node("n2", t.TempDir(), map[string]deploy.RunFunc{"reader": reader("n2")})
	run(b.ctx, n2.Run)
	testenv.WaitFor(t, 10*time.Second, "n2 to enrol", func() bool { _, ok := b.nodes()["n2"]; return ok })
	assign(t, b, mesh.AssignTool, "reader", "n2")
	if e := next("n2"); e.Kind != state.Current {
		t.Fatalf("n2's reader first saw %+v, want the end of an empty bucket", e)
	}

	n1, _ := b.node("n1", t.TempDir(), map[string]deploy.RunFunc{"owner": owner})
	run(b.ctx, n1.Run)
	testenv.WaitFor(t, 10*time.Second, "n1 to enrol", func() bool { _, ok := b.nodes()["n1"]; return ok })
	assign(t, b, mesh.AssignTool, "owner", "n1")
	select {
	case err := <-put:
		if err != nil {
			t.Fatalf("the owner's put on n1: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the owner never ran on n1")
	}
	if e := next("n2"); e.Kind != state.Value || e.Key != "greeting" || string(e.Value) != `{"from":"n1"}` {
		t.Fatalf("n2's watch saw %+v, want n1's greeting", e)
	}

	n3, _ := b.node("n3", t.TempDir(), map[string]deploy.RunFunc{"reader": reader("n3")})
	run(b.ctx, n3.Run)
	testenv.WaitFor(t, 10*time.Second, "n3 to enrol", func() bool { _, ok := b.nodes()["n3"]; return ok })
	assign(t, b, mesh.AssignTool, "reader", "n2", "n3")
	if e := next("n3"); e.Kind != state.Value || e.Key != "greeting" {
		t.Fatalf("n3, assigned afterwards, first read %+v, want the greeting", e)
	}
	if e := next("n3"); e.Kind != state.Current {
		t.Fatalf("n3's next event %+v, want the end of the current values", e)
	}

	// owner out of process on n4: the node serves its socket while it is
	// assigned there.
	dir4 := t.TempDir()
	n4, _ := b.node("n4", dir4, nil)
	run(b.ctx, n4.Run)
	testenv.WaitFor(t, 10*time.Second, "n4 to enrol", func() bool { _, ok := b.nodes()["n4"]; return ok })
	assign(t, b, mesh.AssignTool, "owner", "n1", "n4")
	sock := state.SocketPath(dir4, "owner")
	testenv.WaitFor(t, 10*time.Second, "n4 to serve owner's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("owner's socket directory on n4: %v %v, want 0700", fi.Mode(), err)
	}
	// The file is there from the socket's bind, a moment before it
	// listens (a dial between the two was refused once in CI).
	var c *state.Client
	testenv.WaitFor(t, 10*time.Second, "n4's socket to answer", func() bool {
		var err error
		c, err = state.Dial(b.ctx, sock)
		return err == nil
	})
	if _, err := c.Put(b.ctx, "builds", "greeting", []byte(`{"from":"n4"}`)); err != nil {
		t.Fatalf("owner's put through n4's socket: %v", err)
	}
	for _, node := range []string{"n2", "n3"} {
		if e := next(node); e.Kind != state.Value || string(e.Value) != `{"from":"n4"}` {
			t.Fatalf("%s saw %+v, want n4's greeting", node, e)
		}
	}
	c.Close()
	assign(t, b, mesh.UnassignTool, "owner", "n4")
	testenv.WaitFor(t, 10*time.Second, "n4 to stop serving owner's socket", func() bool { _, err := os.Stat(sock); return os.IsNotExist(err) })
	b.noViolations()
}
