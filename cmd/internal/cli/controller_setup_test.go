package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/registry"
)

// startController runs build-controller (daemon.RunController) with opts
// until ctx ends, its end said on errs, and returns once it is ready; a
// controller that stops or is not ready within a minute fails the test.
func startController(t *testing.T, ctx context.Context, opts daemon.ControllerOptions, errs chan<- error) {
	t.Helper()
	ready := make(chan struct{})
	opts.Ready = ready
	ended := make(chan error, 1)
	go func() {
		err := daemon.RunController(ctx, opts)
		ended <- err
		errs <- err
	}()
	select {
	case <-ready:
	case err := <-ended:
		t.Fatalf("controller: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("controller not ready in a minute")
	}
}

// registryFarm starts the controller of the catalogue in catDir on s,
// pushing to the registry reg, and returns once it is ready, with the
// context it and daemons more (the test's agents, each its end said on
// errs) run under; cleanup cancels it and waits for all of them.
func registryFarm(t *testing.T, s *server.Server, catDir, reg string, daemons int) (context.Context, chan<- error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1+daemons)
	t.Cleanup(func() {
		cancel()
		// A test that failed before it started its agents has fewer to
		// wait for: bounded, so that it fails instead of hanging.
		for range 1 + daemons {
			select {
			case <-errs:
			case <-time.After(time.Minute):
				t.Errorf("registryFarm: the controller or an agent did not end a minute after the test")
				return
			}
		}
	})
	copts := registryController(s, catDir, reg)
	copts.Log = testenv.Log(t, "controller")
	startController(t, ctx, copts, errs)
	return ctx, errs
}

// runFleetController starts a server and the example fleet's controller on
// it (fleetController) with a context that ends with the test; stop ends
// it before and returns what its run returned.
func runFleetController(t *testing.T) (s *server.Server, ctx context.Context, stop func() error) {
	t.Helper()
	s = natstest.Server(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	errs := make(chan error, 1)
	startController(t, ctx, fleetController(t, s), errs)
	return s, ctx, func() error { cancel(); return <-errs }
}

// fleetController is build-controller of the example fleet on s, with a
// registry that never answers: its workers push nothing, any image is
// taken to exist.
func fleetController(t *testing.T, s *server.Server) daemon.ControllerOptions {
	return daemon.ControllerOptions{NATS: s.ClientURL(), Catalogue: fleet(t),
		Controller: cascade.Config{Registry: "127.0.0.1:1", Images: testenv.AnyImage{}}}
}

// registryController is build-controller as it runs by default (its
// defaults, the idle window among them) on s, for catalogue catDir,
// pushing to the real registry reg over plain HTTP.
func registryController(s *server.Server, catDir, reg string) daemon.ControllerOptions {
	cfg := cascade.DefaultConfig()
	cfg.Registry, cfg.RegistryClient = reg, registry.NewClient(registry.WithInsecure(true))
	return daemon.ControllerOptions{NATS: s.ClientURL(), Catalogue: catDir, Controller: cfg}
}

// runFleetAgent runs build-agent (daemon.RunAgent) on s with cfg and the
// buildkitd bk, the registry over plain HTTP and fleetRepo fetched from
// gitDir, logging to log (nil: nowhere), until ctx ends; its end is said on
// errs.
func runFleetAgent(t *testing.T, ctx context.Context, s *server.Server, cfg agent.Config, bk, gitDir string, log *slog.Logger, errs chan<- error) {
	opts := daemon.AgentOptions{NATS: s.ClientURL(), Agent: cfg, BuildKit: bk,
		RegistryClient: registry.NewClient(registry.WithInsecure(true)), Workspace: t.TempDir(), InsteadOf: map[string]string{fleetRepo: gitDir}, Log: log}
	go func() { errs <- daemon.RunAgent(ctx, opts) }()
}

// pushWatch runs `builds --json push --repo fleetRepo --commit commit
// --watch` on the bus at url and decodes the plan it watched settle.
func pushWatch(t *testing.T, ctx context.Context, url, commit string) cli.PlanView {
	t.Helper()
	var out, errw bytes.Buffer
	if code := cli.Main(ctx, []string{"--nats", url, "--json", "push", "--repo", fleetRepo, "--commit", commit, "--watch"}, &out, &errw); code != 0 {
		t.Fatalf("builds push --watch exit %d\nstdout %s\nstderr %s", code, out.String(), errw.String())
	}
	var view cli.PlanView
	if err := json.Unmarshal(out.Bytes(), &view); err != nil {
		t.Fatalf("decoding %q: %v", out.String(), err)
	}
	return view
}

// meshCatalogue is a new catalogue directory holding the mesh's own modules
// from examples/fleet (build-agent, build-controller, git); a test adds the
// modules it builds.
func meshCatalogue(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, m := range []string{"build-agent", "build-controller", "git"} {
		data, err := os.ReadFile(filepath.Join(root, "examples/fleet/catalogue", m+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		addModule(t, dir, m, string(data))
	}
	return dir
}

// addModule writes module's manifest y into the catalogue directory catDir.
func addModule(t *testing.T, catDir, module, y string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(catDir, module+".yaml"), []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
}
