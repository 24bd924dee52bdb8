package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// A running controller raises a changed catalogue, and keeps the one in use
// when a change is refused.
func TestTheControllerRaisesACatalogueChange(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, m := range testenv.MeshModules {
		data, err := os.ReadFile(filepath.Join(root, "examples/fleet/catalogue", m+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, m+".yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- RunController(ctx, ControllerOptions{NATS: s.ClientURL(), Catalogue: dir, Poll: 100 * time.Millisecond,
			Controller: cascade.Config{Registry: "127.0.0.1:1"}, Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatal(err)
	}
	streamExists := func(name string) bool {
		_, err := js.Stream(ctx, name)
		return err == nil
	}
	if streamExists(mesh.SeatStream("scanner")) {
		t.Fatal("the scanner seat's queue exists before it is declared")
	}
	// A module declaring a new seat: its queue is raised without a restart.
	scanner := "module: scan\nseats:\n  - seat: scanner\n    scope: node\n    accepts: [scan retain 1d]\n    emits: [scanned]\n"
	if err := os.WriteFile(filepath.Join(dir, "scan.yaml"), []byte(scanner), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !streamExists(mesh.SeatStream("scanner")) {
		if time.Now().After(deadline) {
			t.Fatal("the changed catalogue was not raised")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A broken change is refused: what is in use stays, nothing is raised.
	if err := os.WriteFile(filepath.Join(dir, "broken.yaml"), []byte("module: broken\nseats:\n  - seat: mesh-evil\n    accepts: [x]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if streamExists(mesh.SeatStream("mesh-evil")) {
		t.Fatal("a refused catalogue was raised")
	}
	select {
	case err := <-errc:
		t.Fatalf("the controller stopped on a refused catalogue: %v", err)
	default:
	}
	// Still serving: its tools answer.
	nc, _ := natstest.Connect(t, s)
	if _, err := cascade.Call(ctx, nc, "build-controller", cascade.ToolRetry, cascade.Request{Plan: "none"}); !errors.Is(err, cascade.ErrNoPlan) {
		t.Fatalf("controller tools after a refused change: %v", err)
	}
	st, err := js.Stream(ctx, mesh.SeatStream("scanner"))
	if err != nil || st.CachedInfo().Config.Retention != jetstream.WorkQueuePolicy {
		t.Fatalf("scanner queue: %v", err)
	}
}

// An agent given a catalogue directory with problems does not stop: it
// runs without one (every module accepted) until the directory is fixed,
// then keeps the last good catalogue while it is broken again.
func TestABadCatalogueDoesNotStopTheAgent(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(bad, []byte("module: [not a name\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	known := knownModules(dir, slog.New(slog.NewTextHandler(&logs, nil)))
	if !known("anything") || !strings.Contains(logs.String(), "problems") {
		t.Fatalf("a broken catalogue: want every module accepted and the problems logged; logs: %s", logs.String())
	}
	// Fixed: the catalogue is read again and refuses what it does not build.
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	for _, m := range testenv.MeshModules {
		data, err := os.ReadFile(filepath.Join(root, "examples/fleet/catalogue", m+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, m+".yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte("module: app\nbuild:\n  repo: https://git.example/app.git\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if known("anything") || !known("app") {
		t.Fatal("a fixed catalogue: want app accepted and anything refused")
	}
	// Broken again: the last good one is kept.
	if err := os.WriteFile(bad, []byte("module: [not a name\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if known("anything") || !known("app") {
		t.Fatal("broken again: want the last good catalogue kept")
	}
}
