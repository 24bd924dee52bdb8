// Package daemon starts the farm's long-running processes from options:
// a build agent (RunAgent) and the controller (RunController), each with
// its connection to NATS, its catalogue and its /metrics (AgentMetrics,
// ControllerMetrics). cmd/build-agent and cmd/build-controller are thin
// layers over it: they fill the options from flags (Env, SplitList,
// ParseInsteadOf). The embedded farm of `builds up` (internal/farm) runs
// the same functions in one process.
package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

// Connect dials NATS as a principal: its inbox prefix is the one its
// derived permissions allow. urls is a comma-separated list.
func Connect(urls, creds, principal, name string) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.CustomInboxPrefix(mesh.InboxPrefix(principal)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
	}
	if creds != "" {
		opts = append(opts, nats.UserCredentials(creds))
	}
	nc, err := nats.Connect(urls, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to NATS at %s: %w (is the server running? set --nats or MESHBUILD_NATS)", urls, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// AgentOptions configure one build agent process.
type AgentOptions struct {
	NATS, Creds string
	Agent       agent.Config
	// BuildKit is the address of the machine's buildkitd
	// (unix:///run/buildkit/buildkitd.sock, tcp://…).
	BuildKit string
	// RegistryClient is how the agent verifies its pushes; nil is
	// registry.NewClient() (credentials from the docker config).
	RegistryClient *registry.Client
	// Workspace holds clones and checkouts.
	Workspace string
	// InsteadOf rewrites repository URLs (git's url.<base>.insteadOf).
	InsteadOf map[string]string
	// Catalogue, when set, is the catalogue directory: an ask for a module
	// it does not build is refused (the directory is read again before
	// refusing, so a module added since is accepted).
	Catalogue string
	// Observer receives the agent's metrics; nil for none.
	Observer agent.Observer
	Log      *slog.Logger
}

// RunAgent runs a build agent until ctx is done.
func RunAgent(ctx context.Context, o AgentOptions) error {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := o.Agent.Validate(); err != nil {
		return err
	}
	if o.BuildKit == "" {
		return fmt.Errorf("%w: no buildkitd: set --buildkit (e.g. unix:///run/buildkit/buildkitd.sock)", agent.ErrConfig)
	}
	if o.Workspace == "" {
		return fmt.Errorf("%w: no workspace: set --workspace DIR", agent.ErrConfig)
	}
	bk, err := agent.NewBuildKit(o.BuildKit, agent.BuildKitOptions{Registry: o.RegistryClient})
	if err != nil {
		return err
	}
	defer bk.Close()
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = bk.Ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return nil // stopped while starting: not a failure
	}
	if err != nil {
		// Not a reason to stop (under systemd, a crash loop): the agent
		// shows unhealthy and takes no ask until the daemon answers.
		o.Log.Error("buildkitd does not answer: start it, or point --buildkit at the one this machine runs; no asks are taken until it answers",
			"buildkit", o.BuildKit, "err", err)
	}
	nc, js, err := Connect(o.NATS, o.Creds, "build-agent", "build-agent "+o.Agent.Machine)
	if err != nil {
		return err
	}
	defer nc.Close()
	if o.Catalogue != "" {
		o.Agent.Known = knownModules(o.Catalogue, o.Log)
	}
	w := &agent.BuildWorker{
		Sources: &agent.Sources{Dir: o.Workspace, InsteadOf: o.InsteadOf},
		Builder: bk,
	}
	a, err := agent.New(o.Agent, js, w, o.Log, o.Observer)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// ControllerOptions configure the controller process.
type ControllerOptions struct {
	NATS, Creds string
	// Catalogue is the catalogue directory; it is watched for changes.
	Catalogue  string
	Controller cascade.Config
	Observer   cascade.Observer
	// Fleet receives the fleet's metrics (deploy.NewMetrics); nil for none.
	Fleet deploy.Observer
	// Poll is how often the catalogue directory is checked for changes.
	Poll time.Duration
	Log  *slog.Logger
	// Ready, if set, is closed once the controller has raised the
	// catalogue and serves its tools.
	Ready chan<- struct{}
}

// ErrCatalogue is returned when a catalogue has problems; they were logged.
var ErrCatalogue = errors.New("the catalogue has problems")

// LoadCatalogue loads and checks a catalogue; problems are logged and any
// error refuses it.
func LoadCatalogue(dir string, log *slog.Logger) (*mesh.Catalogue, error) {
	cat, problems, err := mesh.Load(dir)
	if err != nil {
		return nil, err
	}
	for _, p := range problems {
		if p.Warning {
			log.Warn("catalogue", "problem", p.String())
		} else {
			log.Error("catalogue", "problem", p.String())
		}
	}
	if mesh.HasErrors(problems) {
		return nil, fmt.Errorf("%w: run `builds catalogue check %s`", ErrCatalogue, dir)
	}
	return cat, nil
}

// RunController raises the catalogue and runs the controller until ctx is
// done, raising again whenever the catalogue changes.
func RunController(ctx context.Context, o ControllerOptions) error {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Poll == 0 {
		o.Poll = 2 * time.Second
	}
	if o.Controller.Registry == "" {
		return fmt.Errorf("%w: no registry: set --registry HOST:PORT (MESHBUILD_REGISTRY)", cascade.ErrConfig)
	}
	cat, err := LoadCatalogue(o.Catalogue, o.Log)
	if err != nil {
		return err
	}
	nc, js, err := Connect(o.NATS, o.Creds, "controller", "build-controller")
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := cascade.New(o.Controller, js, cat, o.Log, o.Observer)
	if err != nil {
		return err
	}
	// The fleet's side runs beside the cascade, on the same connection:
	// enrolments, assignments, declarations and the nodes' reports.
	dc := deploy.DefaultControllerConfig()
	dc.Module, dc.Replicas = o.Controller.Module, o.Controller.Replicas
	dc.Raise = false // the cascade raised the wire, the declarations stream with it
	fleet, err := deploy.NewController(dc, js, cat, o.Log.With("part", "fleet"), o.Fleet)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- c.Run(ctx) }()
	if err := waitControllerReady(ctx, nc, c.Module(), errc); err != nil {
		return err
	}
	go func() {
		if err := fleet.Run(ctx); err != nil {
			errc <- fmt.Errorf("the fleet: %w", err)
		}
	}()
	if o.Ready != nil {
		close(o.Ready)
	}
	fp, _ := fingerprint(o.Catalogue)
	t := time.NewTicker(o.Poll)
	defer t.Stop()
	for {
		select {
		case err := <-errc:
			return err
		case <-t.C:
			now, err := fingerprint(o.Catalogue)
			if err != nil || now == fp {
				continue
			}
			fp = now
			cat, err := LoadCatalogue(o.Catalogue, o.Log)
			if err != nil {
				o.Log.Error("catalogue changed but is refused; keeping the one in use", "err", err)
				continue
			}
			if err := c.SetCatalogue(ctx, cat); err != nil {
				o.Log.Error("raising the changed catalogue", "err", err)
				continue
			}
			sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
			err = fleet.SetCatalogue(sctx, cat)
			scancel()
			if err != nil {
				o.Log.Error("giving the fleet the changed catalogue", "err", err)
			}
			o.Log.Info("catalogue changed: raised and in use", "modules", len(cat.Modules))
		}
	}
}

func waitControllerReady(ctx context.Context, nc *nats.Conn, module string, errc chan error) error {
	for {
		_, err := cascade.Call(ctx, nc, module, cascade.ToolRetry, cascade.Request{Plan: "-"})
		if errors.Is(err, cascade.ErrNoPlan) {
			return nil
		}
		select {
		case err := <-errc:
			errc <- err
			if err == nil {
				err = errors.New("controller stopped")
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// fingerprint hashes the names, sizes and times of a catalogue's files.
func fingerprint(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var lines []string
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			lines = append(lines, fmt.Sprintf("%s %d %d", e.Name(), info.Size(), info.ModTime().UnixNano()))
		}
	}
	sort.Strings(lines)
	h := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(h[:]), nil
}

// Workspace returns a default workspace directory for a machine.
func Workspace(base, machine string) string { return filepath.Join(base, "agents", machine) }

// knownModules says whether the catalogue in dir builds a module. A
// catalogue with problems does not stop the agent (under systemd that is a
// crash loop): the problems are logged and the last good catalogue kept,
// or, before any was good, every module accepted, until the directory is
// fixed. The directory is read again before a module is refused, so a
// module added since is accepted.
func knownModules(dir string, log *slog.Logger) func(string) bool {
	cat, err := LoadCatalogue(dir, log)
	if err != nil {
		log.Error("the catalogue has problems: running without one (every module accepted) until it is fixed", "dir", dir, "err", err)
		cat = nil
	}
	var mu sync.Mutex
	builds := func(c *mesh.Catalogue, m string) bool {
		man, ok := c.Module(m)
		return ok && man.Build != nil
	}
	return func(m string) bool {
		mu.Lock()
		defer mu.Unlock()
		if cat != nil && builds(cat, m) {
			return true
		}
		fresh, err := LoadCatalogue(dir, log)
		switch {
		case err == nil:
			cat = fresh
		case cat == nil:
			log.Warn("the catalogue still has problems: accepting the ask", "dir", dir, "module", m, "err", err)
			return true
		default:
			log.Warn("the catalogue has problems: keeping the last good one", "dir", dir, "err", err)
		}
		return builds(cat, m)
	}
}
