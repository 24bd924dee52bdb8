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
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// A running controller raises a changed catalogue, and keeps the one in use
// when a change is refused.
func TestTheControllerRaisesACatalogueChange(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	dir := t.TempDir()
	meshManifests(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- RunController(ctx, ControllerOptions{NATS: s.ClientURL(), Catalogue: dir, Poll: 100 * time.Millisecond,
			Controller: cascade.Config{Registry: "127.0.0.1:1", Images: testenv.AnyImage{}}, Ready: ready})
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

// meshManifests writes the farm's own manifests (examples/fleet's of
// meshtest.MeshModules) into dir.
func meshManifests(t *testing.T, dir string) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range meshtest.MeshModules {
		data, err := os.ReadFile(filepath.Join(root, "examples/fleet/catalogue", m+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, m+".yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fleetManifests writes the farm's own manifests and app's into dir.
func fleetManifests(t *testing.T, dir string) {
	t.Helper()
	meshManifests(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte("module: app\nbuild:\n  repo: https://git.example/app.git\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// An agent given a catalogue it cannot use — a manifest whose YAML is not
// closed, a directory that is missing or empty — fails closed: it says so
// in one line naming the file (or directory) and the retry, once however
// often it tries, takes no ask meanwhile (agentCatalogue does not return),
// and goes on once the directory is fixed. Before, it ran "without one
// (every module accepted)" and bound every worker platform.
func TestABrokenCatalogueFailsClosedWithOneErrorAndARetry(t *testing.T) {
	for _, tc := range []struct {
		name     string
		breakDir func(dir string) string // breaks dir, returns what the error must name
	}{
		{"unclosed YAML", func(dir string) string {
			fleetManifests(t, dir)
			bad := filepath.Join(dir, "broken.yaml")
			if err := os.WriteFile(bad, []byte("module: broken\nbuild:\n  repo: [https://git.example/b.git\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			return bad
		}},
		{"missing directory", func(dir string) string {
			if err := os.Remove(dir); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{"empty directory", func(dir string) string { return dir }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "catalogue")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			names := tc.breakDir(dir)
			var logs testenv.Buffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type loaded struct {
				cat *mesh.Catalogue
				err error
			}
			done := make(chan loaded, 1)
			go func() {
				cat, err := agentCatalogue(ctx, dir, 20*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil)))
				done <- loaded{cat, err}
			}()
			testenv.WaitFor(t, 10*time.Second, "the agent to say the catalogue cannot be used", func() bool {
				return strings.Contains(logs.String(), "cannot be used")
			})
			// Tried again and again meanwhile: still one line, and nothing
			// accepted.
			time.Sleep(200 * time.Millisecond)
			select {
			case l := <-done:
				t.Fatalf("agentCatalogue returned %v, %v with a broken catalogue: want it to wait", l.cat, l.err)
			default:
			}
			lines := testenv.GrepLines(logs.String(), "cannot be used")
			if n := strings.Count(lines, "\n") + 1; n != 1 {
				t.Errorf("said %d times, want once:\n%s", n, lines)
			}
			for _, want := range []string{names, "taking no asks until it loads", "trying again every 20ms"} {
				if !strings.Contains(lines, want) {
					t.Errorf("the error %q does not say %q", lines, want)
				}
			}
			t.Logf("%s", lines)

			// Fixed: it loads, says so, and the agent goes on.
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			fleetManifests(t, dir)
			var l loaded
			select {
			case l = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the fixed catalogue was not loaded")
			}
			if l.err != nil || l.cat == nil || !strings.Contains(logs.String(), "loads now") {
				t.Fatalf("after the fix: %v, %v; logs: %s", l.cat, l.err, logs.String())
			}
		})
	}
}

// The agent refuses what its catalogue does not build, reads the directory
// again before refusing (a module added since is accepted), and keeps the
// last good catalogue while the directory is broken.
func TestTheAgentsCatalogueKeepsTheLastGoodOne(t *testing.T) {
	dir := t.TempDir()
	fleetManifests(t, dir)
	cat, err := LoadCatalogue(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	known, _ := knownModules(dir, cat, slog.New(slog.NewTextHandler(&logs, nil)))
	if known("anything") || !known("app") {
		t.Fatal("want app accepted and anything refused")
	}
	if err := os.WriteFile(filepath.Join(dir, "tool.yaml"), []byte("module: tool\nbuild:\n  repo: https://git.example/tool.git\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !known("tool") {
		t.Fatal("a module added since was refused")
	}
	bad := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(bad, []byte("module: [not a name\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if known("anything") || !known("app") || !known("tool") {
		t.Fatal("broken again: want the last good catalogue kept")
	}
	if !strings.Contains(logs.String(), "broken.yaml") {
		t.Errorf("the warning does not name the broken file: %s", logs.String())
	}
}
