// Package cascadetest starts the parts a test of the build controller runs
// against — a controller, a real agent on a real buildkitd — and waits for
// the controller to serve its tools, or opens a plan store. It is for
// tests only: no core package imports it outside its tests.
package cascadetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// Answers reports whether the controller of module serves its tools now:
// a retry in a plan that does not exist is refused with cascade.ErrNoPlan.
// A controller serves its tools once it has raised the catalogue and
// resumed its plans.
func Answers(ctx context.Context, nc *nats.Conn, module string) bool {
	_, err := cascade.Call(ctx, nc, module, cascade.ToolRetry, cascade.Request{Plan: "none"})
	return errors.Is(err, cascade.ErrNoPlan)
}

// WaitReady waits, up to within, until the controller of module serves its
// tools, and fails tb if it does not.
func WaitReady(tb testing.TB, nc *nats.Conn, module string, within time.Duration) {
	tb.Helper()
	testenv.WaitFor(tb, within, "the controller "+module+" serving its tools", func() bool {
		return Answers(context.Background(), nc, module)
	})
}

// Run runs c in wg until ctx ends, failing tb if Run returns an error, and
// returns once it serves its tools (10s at most), asked on nc.
func Run(tb testing.TB, ctx context.Context, wg *sync.WaitGroup, c *cascade.Controller, nc *nats.Conn) {
	tb.Helper()
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			tb.Errorf("controller: %v", err)
		}
	})
	WaitReady(tb, nc, c.Module(), 10*time.Second)
}

// Agent runs in wg, until ctx ends, a real agent named machine on its own
// connection to url: it builds on the buildkitd at bk, pushes to an
// insecure registry, and checks meshtest.FleetRepo out of the repository at
// git.
func Agent(tb testing.TB, ctx context.Context, wg *sync.WaitGroup, url, bk, git, machine string) {
	tb.Helper()
	b, err := agent.NewBuildKit(bk, agent.BuildKitOptions{Registry: registry.NewClient(registry.WithInsecure(true))})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Close() })
	w := &agent.BuildWorker{
		Sources: &agent.Sources{Dir: tb.TempDir(), InsteadOf: map[string]string{meshtest.FleetRepo: git}},
		Builder: b,
	}
	nc, err := nats.Connect(url, nats.Name(machine))
	if err != nil {
		tb.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.Machine, cfg.FetchWait = machine, 500*time.Millisecond
	a, err := agent.New(cfg, js, w, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	wg.Go(func() { _ = a.Run(ctx); nc.Close() })
}

// Store starts a server, raises meshtest's catalogue of the mesh's own
// modules on it, and opens build-controller's plan store there.
func Store(tb testing.TB) *cascade.Store {
	tb.Helper()
	s := natstest.Server(tb, nil)
	_, js := natstest.Connect(tb, s)
	ctx := context.Background()
	if _, err := mesh.Raise(ctx, js, meshtest.Catalogue(tb, nil), 1); err != nil {
		tb.Fatal(err)
	}
	st, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// PlanStore starts a JetStream server with the controller's plans bucket
// (build-controller's) and no controller, and opens the store on it: for
// writing plan records as a controller would and reading them back as the
// tools do.
func PlanStore(tb testing.TB) (*server.Server, *cascade.Store) {
	tb.Helper()
	s := natstest.Server(tb, nil)
	_, js := natstest.Connect(tb, s)
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: mesh.KVBucket("build-controller", cascade.StateBucket)}); err != nil {
		tb.Fatal(err)
	}
	st, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		tb.Fatal(err)
	}
	return s, st
}

// Background runs run (a controller's Run, say) in a goroutine with a
// context of its own, failing tb if it returns an error; stop cancels that
// context and waits for run to return. The caller calls stop, at cleanup
// if not before; a second call does nothing.
func Background(tb testing.TB, what string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil {
			tb.Errorf("%s: %v", what, err)
		}
	}()
	return func() { cancel(); <-done }
}

// Bed is what a test of the controller against real agents on real
// BuildKit runs on: a registry holding busybox (reg/busybox:latest), a git
// repository of the test's files, the catalogue of its graph, a NATS
// server (URL) and a connection to it, and a context that ends when the
// test does, the test then waiting for WG.
type Bed struct {
	Reg, Git, URL string
	Cat           *mesh.Catalogue
	NC            *nats.Conn
	JS            jetstream.JetStream
	Ctx           context.Context
	WG            *sync.WaitGroup
}

// RealBed requires real BuildKit and starts a Bed: files are the git
// repository's (path to content), graph the catalogue's (module to what it
// is built on).
func RealBed(tb testing.TB, files map[string]string, graph map[string][]string) *Bed {
	tb.Helper()
	testenv.RequireBuildkit(tb)
	reg := registrytest.Registry(tb)
	testenv.Busybox(tb, reg)
	git, _ := testenv.GitRepo(tb, files)
	s := natstest.Server(tb, nil)
	nc, js := natstest.Connect(tb, s)
	ctx, stop := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	tb.Cleanup(func() { stop(); wg.Wait() })
	return &Bed{Reg: reg, Git: git, URL: s.ClientURL(), Cat: meshtest.Catalogue(tb, graph), NC: nc, JS: js, Ctx: ctx, WG: wg}
}

// Controller makes a controller of cfg on the bed's catalogue and runs it
// (Run) until the test ends.
func (b *Bed) Controller(tb testing.TB, cfg cascade.Config) *cascade.Controller {
	tb.Helper()
	c, err := cascade.New(cfg, b.JS, b.Cat, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	Run(tb, b.Ctx, b.WG, c, b.NC)
	return c
}

// Agent runs a real agent named machine on the buildkitd at bk until the
// test ends (Agent).
func (b *Bed) Agent(tb testing.TB, bk, machine string) {
	tb.Helper()
	Agent(tb, b.Ctx, b.WG, b.URL, bk, b.Git, machine)
}
