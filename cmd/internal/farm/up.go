// Package farm is the embedded default of `builds up`: a whole farm on one
// machine — NATS with JetStream, a registry, buildkitd, the controller and
// N agents — started from options in one process (Up) and stopped again
// (Farm.Stop). The controller and the agents are those of package daemon,
// as build-controller and build-agent run them.
package farm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/diskfree"
	"github.com/meshbuild/meshbuild/registry"
)

// The embedded default's listen addresses.
const (
	DefaultListenNATS     = "127.0.0.1:4222"
	DefaultListenRegistry = "127.0.0.1:5000"
)

// UpOptions configure the embedded default: a whole farm on one machine.
// Catalogue is required; every other field has a default.
type UpOptions struct {
	// Catalogue is the catalogue directory the controller raises (and
	// watches).
	Catalogue string
	// Agents is how many build agents run; default 1, NoAgents for none
	// (the farm's buildkitd is started for agents run by hand). Each works
	// one ask at a time; they share one buildkitd unless BuildkitdPerAgent.
	Agents int
	// StateDir holds NATS's store, the registry's blobs, buildkitd's state
	// and the agents' workspaces. Empty makes a temporary directory, removed
	// by Stop; a given one is kept (and reused by the next Up). Either is
	// locked while the farm runs: Up on a directory another farm holds is
	// refused with a *StateInUseError naming its pid.
	StateDir string
	// ListenNATS and ListenRegistry are the addresses NATS and the registry
	// listen on; defaults DefaultListenNATS and DefaultListenRegistry. Port
	// 0 picks a free port (see Farm.NATSURL and Farm.RegistryAddr).
	ListenNATS, ListenRegistry string
	// BuildKit is the address of a running buildkitd to use. Empty starts
	// BuildkitdBin as a child, trusting the registry over plain HTTP.
	BuildKit string
	// BuildkitdBin is the buildkitd binary; empty looks for buildkitd next
	// to the running executable, then bin/buildkitd, then in PATH.
	BuildkitdBin string
	// BuildkitdPerAgent starts one buildkitd for each agent, each with its
	// own state and socket, as if every agent were a machine of its own
	// (nothing is cached between them but through the registry). It cannot
	// be combined with BuildKit.
	BuildkitdPerAgent bool
	// MaxParallelism bounds the build steps each buildkitd started here
	// runs at once (max-parallelism in its buildkitd.toml); 0 is BuildKit's
	// default, the number of CPUs. It cannot be combined with BuildKit.
	MaxParallelism int
	// MetricsBase is the first address /metrics is served on: the
	// controller on it, agent i on the port i above it
	// ("127.0.0.1:9464" → 9464, 9465, …). Empty serves no metrics.
	MetricsBase string
	// InsteadOf rewrites repository URLs for the agents (git's
	// url.<base>.insteadOf); the demo maps its remote to its repository.
	InsteadOf map[string]string
	// Window is the controller's window (cascade.Config.Window). 0 is the
	// controller's default (cascade.DefaultConfig, as build-controller and
	// `builds up` run it: WindowIdle); WindowEvery asks for its window 0,
	// every released ask published at once.
	Window int
	// Cluster, when 3 or more, runs that many NATS servers joined by routes
	// instead of one (the first on ListenNATS, the others on free ports),
	// every stream and bucket at ClusterReplicas replicas: a JetStream
	// cluster on one machine, for trying one. 0 or 1 runs one server.
	Cluster int
	// Log receives every component's log (NATS, buildkitd, controller,
	// agents); nil discards it.
	Log *slog.Logger
	// Out receives what the operator reads: where the farm listens and
	// how to point builds, Prometheus and Grafana at it. nil discards it.
	Out io.Writer
}

// WindowEvery is the UpOptions.Window that publishes every released ask
// the moment it is released: the controller's window 0 (cascade.Config),
// which UpOptions' zero value cannot say since it means the default.
const WindowEvery = math.MinInt

// NoAgents is the UpOptions.Agents of a farm that runs no build agent of
// its own (`builds up --agents 0`): its NATS, registry, buildkitd and
// controller wait for build-agent processes started with credentials from
// `builds creds issue`. UpOptions' zero value cannot say it, since it means
// the default.
const NoAgents = math.MinInt

// ErrUpOptions is wrapped by every refusal of UpOptions.
var ErrUpOptions = errors.New("invalid farm options")

func (o UpOptions) withDefaults() (UpOptions, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrUpOptions, fmt.Sprintf(format, a...))
	}
	if o.Catalogue == "" {
		return o, bad("no catalogue: set --catalogue DIR")
	}
	if fi, err := os.Stat(o.Catalogue); err != nil || !fi.IsDir() {
		return o, bad("catalogue %s is not a directory", o.Catalogue)
	}
	switch {
	case o.Agents == NoAgents:
		if o.BuildkitdPerAgent {
			return o, bad("no agents, and a buildkitd for each agent: choose one")
		}
		o.Agents = 0
	case o.Agents == 0:
		o.Agents = 1
	case o.Agents < 0:
		return o, bad("agents %d: want 1 or more, or none (builds up --agents 0)", o.Agents)
	}
	if o.Cluster < 0 || o.Cluster == 2 {
		return o, bad("--cluster %d: want 3 or more servers (a JetStream cluster needs a majority to survive one lost), or 0 for one server", o.Cluster)
	}
	if o.MaxParallelism < 0 {
		return o, bad("max parallelism %d: want 1 or more, or 0 for BuildKit's default", o.MaxParallelism)
	}
	if o.BuildKit != "" && o.BuildkitdPerAgent {
		return o, bad("--buildkit %s names the one buildkitd to use: it cannot be one buildkitd per agent as well", o.BuildKit)
	}
	if o.BuildKit != "" && o.MaxParallelism > 0 {
		return o, bad("--buildkit %s names a running buildkitd: set max-parallelism in its buildkitd.toml, not here", o.BuildKit)
	}
	if o.ListenNATS == "" {
		o.ListenNATS = DefaultListenNATS
	}
	if o.ListenRegistry == "" {
		o.ListenRegistry = DefaultListenRegistry
	}
	for _, l := range []struct{ flag, addr string }{{"--listen-nats", o.ListenNATS}, {"--listen-registry", o.ListenRegistry}} {
		if _, _, err := splitAddr(l.addr); err != nil {
			return o, bad("%s %s: %v", l.flag, l.addr, err)
		}
	}
	if o.MetricsBase != "" {
		host, port, err := splitAddr(o.MetricsBase)
		if err != nil {
			return o, bad("--metrics %s: %v", o.MetricsBase, err)
		}
		if port == 0 || port+o.Agents > 65535 {
			return o, bad("--metrics %s: want a fixed port with %d free ports after it (e.g. %s)", o.MetricsBase, o.Agents, net.JoinHostPort(host, "9464"))
		}
	}
	switch o.Window {
	case 0:
		o.Window = cascade.DefaultConfig().Window
	case WindowEvery:
		o.Window = 0
	}
	if o.Window < cascade.WindowIdle {
		return o, bad("window %d: want %d (as many as holders are idle), 0 for the default, WindowEvery, or N > 0", o.Window, cascade.WindowIdle)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	return o, nil
}

// splitAddr splits host:port and parses the port.
func splitAddr(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q: want 0-65535", p)
	}
	return host, port, nil
}

// AddrInUseError is returned when an address Up is to listen on is taken.
// It matches syscall.EADDRINUSE with errors.Is.
type AddrInUseError struct {
	// What listens ("NATS", "registry", "metrics of agent h-a1"), the
	// address and the flag that changes it.
	What, Addr, Flag string
}

func (e *AddrInUseError) Error() string {
	host, _, _ := net.SplitHostPort(e.Addr)
	return fmt.Sprintf("%s: %s is in use: stop what holds it or pass %s %s",
		e.What, e.Addr, e.Flag, net.JoinHostPort(host, "PORT"))
}

// Unwrap makes errors.Is(err, syscall.EADDRINUSE) true.
func (e *AddrInUseError) Unwrap() error { return syscall.EADDRINUSE }

// Farm is a running embedded default: NATS, a registry, buildkitd, the
// controller and the agents. Stop it.
type Farm struct {
	opts        UpOptions
	stateDir    string
	removeState bool
	// lock is the state directory's, held from Up to Stop (lockState).
	lock *stateLock

	// ns is the NATS server (nsMu: superviseNATS starts it again after a
	// write its store could not make, which it says on storeBroken).
	ns          *server.Server
	nsMu        sync.Mutex
	storeBroken chan string
	natsURL     string // comma-separated on a cluster
	// cluster are the servers of UpOptions.Cluster (ns is nil then).
	cluster []*server.Server
	reg     *registry.Server
	// bks are the buildkitds started here: one, one per agent (in the
	// agents' order), or none when BuildKit names one. bkAddrs[i] is the
	// buildkitd agent i builds with.
	bks []*buildkitd.Buildkitd
	// bkMu guards bks, whose daemons supervise replaces as it starts
	// them again; supervisors are those goroutines, which Stop waits for.
	bkMu        sync.Mutex
	supervisors sync.WaitGroup
	bkAddrs     []string
	// bkShared is the one buildkitd every agent builds with, given or
	// started here; empty with BuildkitdPerAgent.
	bkShared string

	controller *component
	agents     []*component
	machines   []string

	// metrics: the /metrics URLs, the observers, and how to stop serving.
	metrics     []string
	ctrlObs     cascade.Observer
	agentObs    []agent.Observer
	nodeObs     []deploy.Observer
	metricsStop []func()

	failOnce sync.Once
	failed   chan struct{}
	failErr  error

	stopOnce sync.Once
	stopping chan struct{}
	stopped  chan struct{}
	stopErr  error
}

// component is a goroutine of the farm.
type component struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Up starts a farm on this machine, in order: NATS with JetStream, the
// registry, buildkitd (unless BuildKit names one; one per agent with
// BuildkitdPerAgent), the controller (Up
// returns once it has raised the catalogue and serves its tools) and the
// agents. ctx bounds the start only; the farm runs until Stop. Whatever
// started is stopped again when a later part fails.
func Up(ctx context.Context, opts UpOptions) (*Farm, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	f := &Farm{
		opts:     o,
		failed:   make(chan struct{}),
		stopping: make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	if o.StateDir == "" {
		dir, err := os.MkdirTemp("", "meshbuild-")
		if err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
		f.stateDir, f.removeState = dir, true
	} else {
		abs, err := filepath.Abs(o.StateDir)
		if err != nil {
			return nil, fmt.Errorf("state directory %s: %w", o.StateDir, err)
		}
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
		f.stateDir = abs
	}
	lock, err := lockState(f.stateDir)
	if err != nil {
		if f.removeState {
			os.RemoveAll(f.stateDir)
		}
		return nil, err
	}
	f.lock = lock
	if err := f.start(ctx); err != nil {
		f.Stop()
		return nil, err
	}
	f.printBanner()
	return f, nil
}

func (f *Farm) start(ctx context.Context) error {
	o := f.opts
	log := o.Log
	host := nodeHost()
	for i := 1; i <= o.Agents; i++ {
		f.machines = append(f.machines, fmt.Sprintf("%s-a%d", host, i))
	}

	// Every component's credentials, then NATS, which admits only them.
	cat, err := daemon.LoadCatalogue(o.Catalogue, log.With("component", "controller"))
	if err != nil {
		return err
	}
	keys, err := f.issueCreds(cat)
	if err != nil {
		return err
	}
	if o.Cluster > 1 {
		servers, urls, err := startNATSCluster(o.ListenNATS, o.Cluster, filepath.Join(f.stateDir, "nats-cluster"), keys, log.With("component", "nats"))
		if err != nil {
			return err
		}
		f.cluster, f.natsURL = servers, urls
	} else {
		dir, nlog := filepath.Join(f.stateDir, "nats"), log.With("component", "nats")
		f.storeBroken = make(chan string, 1)
		ns, err := startNATS(o.ListenNATS, dir, keys, openFiles(), natsLogger{log: nlog, broken: f.storeBroken})
		if err != nil {
			return err
		}
		f.ns, f.natsURL = ns, ns.ClientURL()
		f.superviseNATS(dir, keys, nlog)
	}
	log.Info("NATS running", "url", f.natsURL)

	// The registry.
	reg, err := registry.Serve(context.Background(), o.ListenRegistry, filepath.Join(f.stateDir, "registry"))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return &AddrInUseError{What: "registry", Addr: o.ListenRegistry, Flag: "--listen-registry"}
		}
		return err
	}
	f.reg = reg
	log.Info("registry running", "addr", reg.Addr())

	// Metrics, before buildkitd: a taken port refuses the start at once.
	if o.MetricsBase != "" {
		if err := f.serveMetrics(); err != nil {
			return err
		}
	}

	// buildkitd.
	if o.BuildKit != "" {
		if err := pingBuildkit(ctx, o.BuildKit); err != nil {
			return err
		}
		f.bkShared = o.BuildKit
		for range f.machines {
			f.bkAddrs = append(f.bkAddrs, o.BuildKit)
		}
	} else if err := f.startBuildkitds(ctx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	// The controller.
	cfg := cascade.DefaultConfig()
	cfg.Registry, cfg.RegistryClient, cfg.Window = reg.Addr(), registry.NewClient(registry.WithInsecure(true)), o.Window
	// The controller's own clones: input keys for every ask.
	cfg.Sources, cfg.InsteadOf = filepath.Join(f.stateDir, "controller", "repos"), o.InsteadOf
	if o.Cluster > 1 {
		cfg.Replicas = ClusterReplicas
	}
	ready := make(chan struct{})
	f.controller = f.run("controller", func(cctx context.Context) error {
		return daemon.RunController(cctx, daemon.ControllerOptions{
			NATS: f.natsURL, Creds: f.ControllerCreds(), Catalogue: o.Catalogue, Controller: cfg, Observer: f.ctrlObs,
			Log: log.With("component", "controller"), Ready: ready,
		})
	})
	select {
	case <-ready:
	case <-f.controller.done:
		return fmt.Errorf("the controller did not start: %w", f.controller.err)
	case <-ctx.Done():
		return ctx.Err()
	}
	log.Info("controller running", "catalogue", o.Catalogue)

	// The build machines are nodes: each enrols, is assigned build-agent
	// and starts it from its declaration (the module it carries).
	for i, machine := range f.machines {
		cfg := agent.DefaultConfig()
		cfg.Machine = machine
		// A stopping farm hands the asks in hand back soon: the queue keeps
		// them for the next Up.
		cfg.Grace = 5 * time.Second
		ao := daemon.AgentOptions{
			NATS: f.natsURL, Creds: f.AgentCreds(machine), Agent: cfg, BuildKit: f.bkAddrs[i], RegistryClient: registry.NewClient(registry.WithInsecure(true)),
			Workspace: daemon.Workspace(f.stateDir, cfg.Machine), InsteadOf: o.InsteadOf, Catalogue: o.Catalogue,
			Log: log.With("component", "agent", "machine", cfg.Machine),
		}
		var nobs deploy.Observer
		if f.agentObs != nil {
			ao.Observer, nobs = f.agentObs[i], f.nodeObs[i]
		}
		f.agents = append(f.agents, f.run("node "+machine, func(nctx context.Context) error {
			return runNode(nctx, f.natsURL, f.NodeCreds(machine), machine, filepath.Join(f.stateDir, "nodes", machine), ao, nobs, log)
		}))
	}
	if len(f.machines) == 0 {
		return nil
	}
	if err := assignBuildAgents(ctx, f.natsURL, f.OperatorCreds(), f.machines); err != nil {
		return err
	}
	log.Info("agents running", "machines", strings.Join(f.machines, ","))
	return nil
}

// startNATS starts an embedded NATS server with JetStream, its store in
// dir, with authorization on: it trusts keys' operator and admits the
// credentials issued from its account, each to its derived set — the same
// server.conf an operator includes in a server of their own.
func startNATS(addr, dir string, keys *creds.Keys, nofile uint64, nl natsLogger) (*server.Server, error) {
	log := nl.log
	host, port, err := splitAddr(addr)
	if err != nil {
		return nil, err
	}
	if port != 0 {
		// The server only logs a port it cannot listen on; find out first.
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, &AddrInUseError{What: "NATS", Addr: addr, Flag: "--listen-nats"}
			}
			return nil, fmt.Errorf("NATS listening on %s: %w", addr, err)
		}
		ln.Close()
	} else {
		port = server.RANDOM_PORT
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("NATS store: %w", err)
	}
	opts, err := keys.ServerOptions()
	if err != nil {
		return nil, err
	}
	opts.ServerName, opts.Host, opts.Port = "meshbuild", host, port
	opts.JetStream, opts.StoreDir, opts.NoSigs = true, dir, true
	capConnections(opts, nofile, 1, log)
	queueForFleet(opts)
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("NATS: %w", err)
	}
	ns.SetLoggerV2(nl, false, false, false)
	go ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("NATS did not start on %s within 15s (see the log)", addr)
	}
	return ns, nil
}

// natsLogger writes the NATS server's log to a slog.Logger, and tells
// broken (when set) of a write its store could not make.
type natsLogger struct {
	log    *slog.Logger
	broken chan<- string
}

func (l natsLogger) Noticef(format string, v ...any) { l.log.Info(fmt.Sprintf(format, v...)) }
func (l natsLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l natsLogger) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l natsLogger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg)
	if l.broken != nil && strings.Contains(msg, storeWriteError) {
		select {
		case l.broken <- msg:
		default:
		}
	}
}

// storeWriteError is how nats-server's file store logs a write it could
// not make (server/filestore.go): from then the stream refuses every write
// with that error until the server starts again, even once the disk has
// room (its fs.werr is kept).
const storeWriteError = "Critical write error"

// superviseNATS starts the farm's NATS server again once its store could
// not write (the disk of the state directory full) and the disk has room
// again (natsRoom): until then, every stream that met the error refuses
// its writes — by hand, the farm's claims could not be renewed and no
// push was planned after the disk was freed, until builds up was started
// again. The clients ride the restart out as they do any bus outage.
func (f *Farm) superviseNATS(dir string, keys *creds.Keys, log *slog.Logger) {
	f.supervisors.Go(func() {
		for {
			var why string
			select {
			case why = <-f.storeBroken:
			case <-f.stopping:
				return
			}
			log.Error("NATS could not write its store: its streams take no writes until it starts again; the farm starts it again once the disk has room",
				"dir", dir, "why", why)
			f.say("NATS could not write its store in %s (%s): nothing is recorded until the disk has room; then NATS starts again by itself", dir, lastLines(why, 1))
			if !f.awaitRoom(dir, log) {
				return
			}
			addr, err := f.restartNATS(dir, keys, log, nil)
			if err != nil {
				f.fail(fmt.Errorf("NATS could not write its store, and would not start again: %w", err))
				return
			}
			select { // what the stopped server said on its way out
			case <-f.storeBroken:
			default:
			}
			log.Info("NATS running again on its store", "addr", addr, "dir", dir)
			f.say("NATS is running again on %s", addr)
		}
	})
}

// restartNATS stops the single NATS server and starts it again on the same
// address and store dir, calling between (when set) while it is stopped;
// it returns the address.
func (f *Farm) restartNATS(dir string, keys *creds.Keys, log *slog.Logger, between func() error) (string, error) {
	f.nsMu.Lock()
	defer f.nsMu.Unlock()
	addr := f.ns.Addr().String()
	f.ns.Shutdown()
	f.ns.WaitForShutdown()
	if between != nil {
		if err := between(); err != nil {
			return addr, err
		}
	}
	ns, err := startNATS(addr, dir, keys, openFiles(), natsLogger{log: log, broken: f.storeBroken})
	if err != nil {
		return addr, err
	}
	f.ns = ns
	return addr, nil
}

// natsRoom is the free space the disk of NATS's store needs before the
// farm starts the server again after a write it could not make.
const natsRoom = 64 << 20

// awaitRoom waits until dir's file system has natsRoom free, or the farm
// stops (false).
func (f *Farm) awaitRoom(dir string, log *slog.Logger) bool {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for n := 0; ; n++ {
		if free, err := diskfree.Free(dir); err == nil && free >= natsRoom {
			return true
		}
		if n%30 == 0 {
			log.Warn("waiting for room on the disk of NATS's store", "dir", dir, "want free", natsRoom)
		}
		select {
		case <-t.C:
		case <-f.stopping:
			return false
		}
	}
}

// say writes a line for the operator (UpOptions.Out), where the log, on
// the same disk, may not be written.
func (f *Farm) say(format string, v ...any) {
	if f.opts.Out != nil {
		fmt.Fprintf(f.opts.Out, format+"\n", v...)
	}
}

func (l natsLogger) Debugf(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l natsLogger) Tracef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }

// startBuildkitds starts the farm's buildkitd, or one for each agent
// (together), and supervises them: one that exits before Stop is started
// again at its address (supervise).
func (f *Farm) startBuildkitds(ctx context.Context) error {
	bin, err := findBuildkitd(f.opts.BuildkitdBin)
	if err != nil {
		return err
	}
	if !f.opts.BuildkitdPerAgent {
		bk, err := f.startBuildkitd(ctx, bin, "buildkitd", f.opts.Log.With("component", "buildkitd"))
		if err != nil {
			return err
		}
		f.bks = append(f.bks, bk)
		f.bkShared = bk.Addr()
		for range f.machines {
			f.bkAddrs = append(f.bkAddrs, bk.Addr())
		}
		f.supervise(0, "buildkitd", f.opts.Log.With("component", "buildkitd"))
		return nil
	}
	bks := make([]*buildkitd.Buildkitd, len(f.machines))
	errs := make([]error, len(f.machines))
	var wg sync.WaitGroup
	for i, m := range f.machines {
		wg.Go(func() {
			log := f.opts.Log.With("component", "buildkitd", "machine", m)
			bks[i], errs[i] = f.startBuildkitd(ctx, bin, "buildkitd-"+m, log)
		})
	}
	wg.Wait()
	// Those that started are stopped by Stop if another did not.
	for _, bk := range bks {
		if bk != nil {
			f.bks = append(f.bks, bk)
		}
	}
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("the buildkitd of %s: %w", f.machines[i], err)
		}
	}
	for i, bk := range bks {
		f.bkAddrs = append(f.bkAddrs, bk.Addr())
		f.supervise(i, "the buildkitd of "+f.machines[i], f.opts.Log.With("component", "buildkitd", "machine", f.machines[i]))
	}
	return nil
}

// startBuildkitd starts bin as a child with its state in dir under the
// farm's state directory, trusting the registry.
func (f *Farm) startBuildkitd(ctx context.Context, bin, dir string, log *slog.Logger) (*buildkitd.Buildkitd, error) {
	bk, err := buildkitd.Start(ctx, buildkitd.Options{
		Bin:            bin,
		Root:           filepath.Join(f.stateDir, dir),
		RegistryHosts:  []string{f.reg.Addr()},
		MaxParallelism: f.opts.MaxParallelism,
		Stderr:         &lineLogger{log: log},
		// A farm runs for long: its cache is kept within BuildKit's
		// default limits, not left to fill the disk.
		GC: true,
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("starting buildkitd: %w", ctx.Err())
	case errors.Is(err, buildkitd.ErrNoRunc):
		return nil, fmt.Errorf("buildkitd cannot run build steps: %w; or pass --buildkit ADDR of a running buildkitd", err)
	case errors.Is(err, buildkitd.ErrNoBinary):
		return nil, fmt.Errorf("%w: run `make deps` to build it, or pass --buildkit ADDR of a running buildkitd", err)
	case err != nil:
		return nil, fmt.Errorf("buildkitd (%s) would not start: %w\nIt runs as root with runc (apt-get install -y runc; `make deps` installs both); or pass --buildkit ADDR of a running buildkitd", bin, err)
	}
	log.Info("buildkitd running", "addr", bk.Addr(), "bin", bin, "root", filepath.Join(f.stateDir, dir))
	return bk, nil
}

// A buildkitd the farm started that exits before Stop is started again,
// at the same address and with its state, as systemd's Restart= does for a
// machine's own: the agents building with it find it gone (a build in hand
// fails as the machine's trouble, retried or handed to another machine),
// take no asks while it does not answer, and go on once it does. One that
// exits within bkQuickExit of starting, bkQuickExits times running, or
// that will not start again, fails the farm, naming it, with its log.
const (
	bkQuickExit  = 30 * time.Second
	bkQuickExits = 3
)

// supervise watches the farm's i-th buildkitd (f.bks[i]) until Stop,
// starting it again each time it exits.
func (f *Farm) supervise(i int, name string, log *slog.Logger) {
	f.supervisors.Go(func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-f.stopping:
				cancel()
			case <-ctx.Done():
			}
		}()
		quick := 0
		for {
			bk, started := f.buildkitd(i), time.Now()
			select {
			case <-bk.Exited():
			case <-f.stopping:
				return
			}
			if ctx.Err() != nil {
				return
			}
			if time.Since(started) < bkQuickExit {
				quick++
			} else {
				quick = 0
			}
			if quick >= bkQuickExits {
				f.fail(fmt.Errorf("%s exited %d times in a row within %s of starting (%v); not started again:\n%s", name, quick, bkQuickExit, bk.ExitErr(), bk.Log()))
				return
			}
			log.Warn("buildkitd exited; starting it again at the same address", "addr", bk.Addr(), "exit", fmt.Sprint(bk.ExitErr()),
				"ran", time.Since(started).Round(time.Millisecond), "log", lastLines(bk.Log(), 5))
			restart := time.Now()
			next, err := bk.Again(ctx)
			if err != nil {
				if ctx.Err() == nil {
					f.fail(fmt.Errorf("%s exited (%v) and would not start again: %w", name, bk.ExitErr(), err))
				}
				return
			}
			f.bkMu.Lock()
			f.bks[i] = next
			f.bkMu.Unlock()
			log.Info("buildkitd running again", "addr", next.Addr(), "took", time.Since(restart).Round(time.Millisecond))
		}
	})
}

// buildkitd is the farm's i-th buildkitd as it runs now.
func (f *Farm) buildkitd(i int) *buildkitd.Buildkitd {
	f.bkMu.Lock()
	defer f.bkMu.Unlock()
	return f.bks[i]
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// pingBuildkit checks that a given buildkitd answers.
func pingBuildkit(ctx context.Context, addr string) error {
	bk, err := agent.NewBuildKit(addr, agent.BuildKitOptions{})
	if err != nil {
		return err
	}
	defer bk.Close()
	if err := bk.Ping(ctx); err != nil {
		return fmt.Errorf("--buildkit %s: %w: start it, or leave --buildkit out to start bin/buildkitd", addr, err)
	}
	return nil
}

// findBuildkitd picks the buildkitd binary: the one given, else next to the
// running executable (bin/builds → bin/buildkitd), else bin/buildkitd under
// the working directory, else buildkitd in PATH.
func findBuildkitd(given string) (string, error) {
	if given != "" {
		return given, nil
	}
	var tried []string
	if exe, err := os.Executable(); err == nil {
		tried = append(tried, filepath.Join(filepath.Dir(exe), "buildkitd"))
	}
	if wd, err := os.Getwd(); err == nil {
		tried = append(tried, filepath.Join(wd, "bin", "buildkitd"))
	}
	for _, p := range tried {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("buildkitd"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w: looked in %s and PATH: run `make deps` to build it, or pass --buildkit ADDR of a running buildkitd",
		buildkitd.ErrNoBinary, strings.Join(tried, ", "))
}

// lineLogger writes what a child prints to a slog.Logger, line by line.
type lineLogger struct {
	log *slog.Logger
	mu  sync.Mutex
	buf []byte
}

func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimSpace(string(w.buf[:i])); line != "" {
			w.log.Info(line)
		}
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 64<<10 {
		w.log.Info(string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

// run starts a component; one that returns before Stop fails the farm.
func (f *Farm) run(name string, fn func(context.Context) error) *component {
	ctx, cancel := context.WithCancel(context.Background())
	c := &component{name: name, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		c.err = fn(ctx)
		select {
		case <-f.stopping:
			return
		default:
		}
		err := c.err
		if err == nil {
			err = errors.New("stopped")
		}
		f.fail(fmt.Errorf("%s: %w", name, err))
	}()
	return c
}

func (f *Farm) fail(err error) {
	f.failOnce.Do(func() {
		f.failErr = err
		f.opts.Log.Error("the farm is failing", "err", err)
		close(f.failed)
	})
}

// NATSURL is NATS's client URL, nats://host:port.
func (f *Farm) NATSURL() string { return f.natsURL }

// RegistryAddr is the registry's host:port.
func (f *Farm) RegistryAddr() string { return f.reg.Addr() }

// BuildKitAddr is the address of the buildkitd the agents build with; with
// BuildkitdPerAgent, the first agent's (see BuildKitAddrs).
func (f *Farm) BuildKitAddr() string {
	if f.bkShared != "" {
		return f.bkShared
	}
	return f.bkAddrs[0]
}

// BuildKitAddrs are the addresses of the buildkitds the agents build with,
// in the order of Machines: all the same unless BuildkitdPerAgent.
func (f *Farm) BuildKitAddrs() []string { return append([]string(nil), f.bkAddrs...) }

// Machines are the agents' machine names, "<host>-a1" ….
func (f *Farm) Machines() []string { return append([]string(nil), f.machines...) }

// MetricsURLs are the /metrics URLs the farm serves: the controller's, then
// each agent's in the order of Machines; none without MetricsBase.
func (f *Farm) MetricsURLs() []string { return append([]string(nil), f.metrics...) }

// StateDir is the farm's state directory.
func (f *Farm) StateDir() string { return f.stateDir }

// InsteadOf is the agents' repository rewriting, as given.
func (f *Farm) InsteadOf() map[string]string { return f.opts.InsteadOf }

// Failed is closed when a part of the farm stops on its own; Wait says
// why.
func (f *Farm) Failed() <-chan struct{} { return f.failed }

// Wait blocks until a part of the farm stops on its own (a buildkitd
// exits, the controller or an agent returns) and returns why, or until
// Stop, and returns nil. The farm is not stopped by a failure: call Stop.
func (f *Farm) Wait() error {
	select {
	case <-f.failed:
		return f.failErr
	case <-f.stopping:
		<-f.stopped
		return nil
	}
}

// Stop stops the farm: the agents first (handing back the asks they hold),
// then the controller, the buildkitds (together), the registry and NATS;
// and removes the state directory if Up made it. It is safe to call more
// than once. It returns what went wrong stopping the buildkitds and the
// registry and removing the state; the agents' and the controller's errors
// are logged.
func (f *Farm) Stop() error {
	f.stopOnce.Do(func() {
		close(f.stopping)
		defer close(f.stopped)
		var errs []error
		stop := func(cs ...*component) {
			for _, c := range cs {
				if c != nil {
					c.cancel()
				}
			}
			for _, c := range cs {
				if c == nil {
					continue
				}
				<-c.done
				// An error after the cancel is most often the cancel
				// itself, in a form errors.Is cannot tell (a gRPC status):
				// it is logged, not returned.
				if c.err != nil && !errors.Is(c.err, context.Canceled) {
					f.opts.Log.Warn("stopped with an error", "component", c.name, "err", c.err)
				}
			}
		}
		stop(f.agents...)
		stop(f.controller)
		for _, m := range f.metricsStop {
			m()
		}
		// No daemon is started again once the supervisors are done.
		f.supervisors.Wait()
		bkErrs := make([]error, len(f.bks))
		var wg sync.WaitGroup
		for i, bk := range f.bks {
			wg.Go(func() {
				if err := bk.Stop(); err != nil {
					bkErrs[i] = fmt.Errorf("buildkitd %s: %w", bk.Addr(), err)
				}
			})
		}
		wg.Wait()
		errs = append(errs, bkErrs...)
		if f.reg != nil {
			if err := f.reg.Close(); err != nil {
				errs = append(errs, fmt.Errorf("registry: %w", err))
			}
		}
		f.nsMu.Lock()
		if f.ns != nil {
			f.ns.Shutdown()
			f.ns.WaitForShutdown()
		}
		f.nsMu.Unlock()
		for _, s := range f.cluster {
			s.Shutdown()
			s.WaitForShutdown()
		}
		if f.removeState {
			if err := os.RemoveAll(f.stateDir); err != nil {
				errs = append(errs, fmt.Errorf("removing %s: %w", f.stateDir, err))
			}
		}
		f.lock.release()
		f.stopErr = errors.Join(errs...)
		f.opts.Log.Info("farm stopped", "err", f.stopErr)
	})
	return f.stopErr
}

// printBanner tells the operator where everything listens.
func (f *Farm) printBanner() {
	w := f.opts.Out
	fmt.Fprintf(w, "meshbuild farm up: %d agent(s), state in %s\n", len(f.machines), f.stateDir)
	if len(f.cluster) > 0 {
		fmt.Fprintf(w, "  NATS        %s (JetStream cluster of %d, streams and buckets R%d; authorization on, keys and credentials in %s)\n", f.natsURL, len(f.cluster), ClusterReplicas, CredsDir(f.stateDir))
	} else {
		fmt.Fprintf(w, "  NATS        %s (JetStream; authorization on, keys and credentials in %s)\n", f.natsURL, CredsDir(f.stateDir))
	}
	fmt.Fprintf(w, "  registry    %s (plain http)\n", f.reg.Addr())
	par := ""
	if n := f.opts.MaxParallelism; n > 0 {
		par = fmt.Sprintf(", max-parallelism %d", n)
	}
	switch {
	case f.opts.BuildKit != "":
		fmt.Fprintf(w, "  buildkitd   %s (given; it must trust %s over plain http)\n", f.bkShared, f.reg.Addr())
	case f.opts.BuildkitdPerAgent:
		for i, m := range f.machines {
			fmt.Fprintf(w, "  buildkitd   %s (started here for %s%s)\n", f.bkAddrs[i], m, par)
		}
	default:
		fmt.Fprintf(w, "  buildkitd   %s (started here%s)\n", f.bkShared, par)
	}
	fmt.Fprintf(w, "  controller  catalogue %s\n", f.opts.Catalogue)
	if len(f.machines) == 0 {
		cat, err := filepath.Abs(f.opts.Catalogue)
		if err != nil {
			cat = f.opts.Catalogue
		}
		fmt.Fprintf(w, "  agents      none of the farm's own: the asks wait for build agents started by hand, e.g.\n")
		fmt.Fprintf(w, "              builds creds issue %s --principal agent NAME --catalogue %s --out NAME.creds\n", CredsDir(f.stateDir), cat)
		rewrite := ""
		for _, from := range slices.Sorted(maps.Keys(f.opts.InsteadOf)) {
			rewrite += fmt.Sprintf(" -git-instead-of %s=%s", from, f.opts.InsteadOf[from])
		}
		fmt.Fprintf(w, "              build-agent -nats %s -creds NAME.creds -machine NAME -buildkit %s -registry-insecure -catalogue %s%s\n", f.natsURL, f.bkShared, cat, rewrite)
	} else {
		fmt.Fprintf(w, "  agents      %s\n", strings.Join(f.machines, ", "))
	}
	f.PrintWhere(w)
}

// PrintWhere tells the operator where to point builds, Prometheus and
// Grafana.
func (f *Farm) PrintWhere(w io.Writer) {
	fmt.Fprintf(w, "Point builds at it:  export MESHBUILD_NATS=%s MESHBUILD_CREDS=%s   (then: builds plans, builds machines)\n", f.natsURL, f.OperatorCreds())
	if len(f.metrics) > 0 {
		fmt.Fprintf(w, "Prometheus: scrape %s\n", strings.Join(f.metrics, " "))
		fmt.Fprintf(w, "Grafana: add that Prometheus as a data source; the dashboards are in metrics/dashboards\n")
	} else {
		fmt.Fprintf(w, "Prometheus and Grafana: start with --metrics 127.0.0.1:9464 to serve /metrics\n")
	}
}

// serveMetrics serves /metrics for the controller on MetricsBase and for
// machine i (its node and the agent it carries) on the port i above it, as
// the mains of build-controller and mesh-node do, and keeps the observers
// the controller, the nodes and the agents report to.
func (f *Farm) serveMetrics() error {
	host, port, _ := splitAddr(f.opts.MetricsBase)
	ctx, cancel := context.WithCancel(context.Background())
	f.metricsStop = append(f.metricsStop, cancel)
	log := f.opts.Log.With("component", "metrics")
	serving := func(i int, what string, err error) error {
		addr := net.JoinHostPort(host, strconv.Itoa(port+i))
		if errors.Is(err, syscall.EADDRINUSE) {
			return &AddrInUseError{What: "metrics of " + what, Addr: addr, Flag: "--metrics"}
		}
		if err != nil {
			return fmt.Errorf("metrics of %s: %w", what, err)
		}
		f.metrics = append(f.metrics, "http://"+addr+"/metrics")
		return nil
	}
	obs, err := daemon.ControllerMetrics(ctx, f.opts.MetricsBase, f.natsURL, f.ControllerCreds(), log)
	if err := serving(0, "the controller", err); err != nil {
		return err
	}
	f.ctrlObs = obs
	for i, m := range f.machines {
		aobs, nobs, err := daemon.NodeMetrics(ctx, net.JoinHostPort(host, strconv.Itoa(port+i+1)), m, log)
		if err := serving(i+1, "node "+m, err); err != nil {
			return err
		}
		f.agentObs, f.nodeObs = append(f.agentObs, aobs), append(f.nodeObs, nobs)
	}
	return nil
}
