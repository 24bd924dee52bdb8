// Package daemon starts the farm's long-running processes from options:
// a build agent (RunAgent) and the controller (RunController), each with
// its connection to NATS, its catalogue and its /metrics (AgentMetrics,
// ControllerMetrics). cmd/build-agent and cmd/build-controller are thin
// layers over it: they fill the options from flags (Env, SplitList,
// ParseInsteadOf). The embedded farm of `builds up` (cmd/internal/farm) runs
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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	seats "github.com/meshbuild/meshbuild/seat"
)

// Connect dials NATS as a principal: its inbox prefix is the one its
// derived permissions allow. urls is a comma-separated list; creds, when
// set, is the principal's credentials file (`builds creds issue`); opts
// add to the connection's options (TLS.Options).
func Connect(urls, creds, principal, name string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	all := []nats.Option{
		nats.Name(name),
		nats.CustomInboxPrefix(mesh.InboxPrefix(principal)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
	}
	if creds != "" {
		if _, err := os.Stat(creds); err != nil {
			return nil, nil, fmt.Errorf("NATS credentials of %s: %w (set --creds or MESHBUILD_CREDS to a file `builds creds issue` wrote)", principal, err)
		}
		all = append(all, nats.UserCredentials(creds))
	}
	nc, err := nats.Connect(urls, append(all, opts...)...)
	switch {
	case err != nil && (errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked)):
		if creds == "" {
			return nil, nil, fmt.Errorf("NATS at %s wants credentials: %w (set --creds or MESHBUILD_CREDS; `builds up` prints the operator's)", urls, err)
		}
		return nil, nil, fmt.Errorf("NATS at %s refused the credentials in %s: %w (were they issued from the keys this server trusts?)", urls, creds, err)
	case errors.Is(err, nats.ErrMaxConnectionsExceeded) || err != nil && strings.Contains(err.Error(), "maximum connections exceeded"):
		// nats.go returns its error value when the answer comes after the
		// connection is up, and a plain error with the server's words
		// when it comes in answer to CONNECT (sendConnect).
		return nil, nil, fmt.Errorf("NATS at %s has no room for another connection: %w (%s)", urls, err, roomHint())
	case errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET):
		// A server with no room answers "maximum connections exceeded"
		// and closes at once: a client still writing its CONNECT hears
		// only the close.
		return nil, nil, fmt.Errorf("NATS at %s closed the connection as it was made: %w (a server with no room for another connection does so; %s; its log says \"maximum connections exceeded\" if that is why)", urls, err, roomHint())
	case err != nil:
		return nil, nil, fmt.Errorf("connecting to NATS at %s: %w (is the server running? set --nats or MESHBUILD_NATS)", urls, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// Logged has a long-running process's connection say on log what happens
// to it: the connection lost and made again (nats.go says nothing of
// either by itself: by hand, an agent through an outage logged only what
// failed for want of the bus), the server's asynchronous errors (an
// authorization or permissions violation, which nats.go would print raw
// on standard error) and a close that ends it for good.
func Logged(log *slog.Logger) []nats.Option {
	var lost atomic.Int64 // when the connection was lost, unix nanoseconds
	return []nats.Option{
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				return // closed by this process
			}
			lost.Store(time.Now().UnixNano())
			log.Warn("lost the connection to NATS; reconnecting", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			args := []any{"server", nc.ConnectedUrlRedacted()}
			if at := lost.Load(); at != 0 {
				args = append(args, "after", time.Since(time.Unix(0, at)).Round(time.Millisecond))
			}
			log.Info("reconnected to NATS", args...)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			args := []any{"err", err}
			if sub != nil {
				args = append(args, "subject", sub.Subject)
			}
			log.Error("NATS refused or dropped something", args...)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				log.Error("the connection to NATS is closed and will not be made again", "err", err)
			}
		}),
	}
}

// roomHint says what a server needs for a fleet's connections
// (mesh.FleetSettingsOf).
func roomHint() string {
	return fmt.Sprintf("its max_connections, or the open files limit it is derived from, is below the fleet's: a server needs ulimit -n of at least machines + %d, %d for %d machines; raise it and restart the server",
		mesh.FleetOtherConnections+mesh.ServerFiles, mesh.FleetSettingsOf(mesh.DefaultFleet).NoFile, mesh.DefaultFleet.Machines)
}

// TLS names the files of a TLS connection to NATS: the CA that signed the
// server's certificate and, for a server that verifies clients, this
// client's certificate and key. The zero value is a plain connection.
type TLS struct{ CA, Cert, Key string }

// Options are TLS's connection options, or an error naming the flag that
// is missing or the file that cannot be read.
func (t TLS) Options() ([]nats.Option, error) {
	var opts []nats.Option
	for _, f := range []struct{ flag, path string }{{"--tls-ca", t.CA}, {"--tls-cert", t.Cert}, {"--tls-key", t.Key}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return nil, fmt.Errorf("%s: %w", f.flag, err)
		}
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, errors.New("--tls-cert and --tls-key go together: give both, or neither")
	}
	if t.CA != "" {
		opts = append(opts, nats.RootCAs(t.CA))
	}
	if t.Cert != "" {
		opts = append(opts, nats.ClientCert(t.Cert, t.Key))
	}
	return opts, nil
}

// AgentOptions configure one build agent process.
type AgentOptions struct {
	NATS, Creds string
	TLS         TLS
	Agent       agent.Config
	// BuildKit is the address of the machine's buildkitd
	// (unix:///run/buildkit/buildkitd.sock, tcp://…).
	BuildKit string
	// BuildKitOptions configure the connection to it and the builds
	// (BuildKitOptions.SourceDateEpoch); the zero value takes every
	// default. Its Registry is RegistryClient.
	BuildKitOptions agent.BuildKitOptions
	// RegistryClient is how the agent verifies its pushes; nil is
	// registry.NewClient() (credentials from the docker config).
	RegistryClient *registry.Client
	// Registry is the mesh's registry (host:port): the machine is
	// unhealthy, and takes no asks, while it does not answer. Empty: the
	// registry of the last ask's image.
	Registry string
	// Workspace holds clones and checkouts.
	Workspace string
	// MinFree is the free space the workspace's file system needs for the
	// machine to take an ask (agent.Sources.MinFree): 0 is
	// agent.DefaultMinFree, a negative number no check.
	MinFree int64
	// InsteadOf rewrites repository URLs (git's url.<base>.insteadOf).
	InsteadOf map[string]string
	// Catalogue, when set, is the catalogue directory: an ask for a module
	// it does not build is refused (the directory is read again before
	// refusing, so a module added since is accepted).
	Catalogue string
	// Observer receives the agent's metrics; nil for none.
	Observer agent.Observer
	Log      *slog.Logger

	// Lease is how long the agent's claim of its machine's seat outlives
	// it. 0 is claim.DefaultLease.
	Lease time.Duration
	// MachineSet says the machine's name was given (--machine): then it
	// must be the one the credentials were issued for; otherwise the
	// credentials' machine is taken.
	MachineSet bool
}

// machineOfCreds is the build machine a credentials file was issued for
// (`builds creds issue … --principal agent NAME`), and the principal's id;
// ok is false for credentials of any other principal.
func machineOfCreds(path string) (m, id string, ok bool, err error) {
	if id, err = creds.PrincipalOf(path); err != nil {
		return "", "", false, err
	}
	m, ok = strings.CutPrefix(id, mesh.PrincipalID(mesh.KindAgent, ""))
	return m, id, ok, nil
}

// AgentMachine is the machine an agent with credentials file path runs as:
// every build machine speaks only for itself, so it is the machine the
// credentials were issued for. machine is the name given (set: by
// --machine), which must then be that one; unset, it is the default, used
// only with credentials of another principal or none.
func AgentMachine(path, machine string, set bool) (string, error) {
	if path == "" {
		return machine, nil
	}
	m, id, ok, err := machineOfCreds(path)
	switch {
	case err != nil:
		return "", fmt.Errorf("%w: %w", agent.ErrConfig, err)
	case !ok:
		// A node's credentials grant a build agent nothing (by hand: "grant
		// none of this machine's platforms", which named no fix).
		if node, isNode := strings.CutPrefix(id, mesh.PrincipalID(mesh.KindNode, "")); isNode {
			return "", fmt.Errorf("%w: the credentials in %s are node %s's, for mesh-node's --creds; a build agent takes its machine's agent credentials: builds creds issue KEYS --catalogue DIR --principal agent %s (mesh-node takes those as --agent-creds)",
				agent.ErrConfig, path, node, node)
		}
		return machine, nil // another principal's: the server says what it may do
	case m == machine || !set:
		return m, nil
	}
	return "", fmt.Errorf("%w: the credentials in %s are build machine %s's, and --machine is %s: every machine speaks only for itself; issue this one its own (builds creds issue KEYS --principal agent %s), or drop --machine",
		agent.ErrConfig, path, m, machine, machine)
}

func agentMachine(o *AgentOptions) (err error) {
	o.Agent.Machine, err = AgentMachine(o.Creds, o.Agent.Machine, o.MachineSet)
	return err
}

// RunAgent runs a build agent until ctx is done.
func RunAgent(ctx context.Context, o AgentOptions) error {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := agentMachine(&o); err != nil {
		return err
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
	bko := o.BuildKitOptions
	bko.Registry = o.RegistryClient
	bk, err := agent.NewBuildKit(o.BuildKit, bko)
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
	// The machine's platforms are its worker's, unless --platforms narrows
	// them to some it builds; with a catalogue, only those its modules are
	// built for (the others have no queue, and no grant to one).
	worker, err := workerPlatforms(ctx, bk, o.Log)
	if err != nil {
		return nil // stopped while waiting for buildkitd
	}
	narrowed := len(o.Agent.Platforms) > 0
	if o.Agent.Platforms, err = agent.ChoosePlatforms(worker, o.Agent.Platforms); err != nil {
		return err
	}
	// A catalogue that cannot be used fails closed: no ask is taken (none
	// accepted blindly, no platform bound blindly) until it loads.
	var cat *mesh.Catalogue
	if o.Catalogue != "" {
		if cat, err = agentCatalogue(ctx, o.Catalogue, catalogueRetry, o.Log); err != nil {
			return nil // stopped while waiting for the catalogue
		}
		if !narrowed {
			o.Agent.Platforms = cataloguePlatforms(cat, o.Agent.Platforms, o.Log)
		}
	}
	// Only the platforms the credentials grant: a queue the agent may not
	// read is not bound (no permission violations, no timeouts).
	if o.Creds != "" {
		if o.Agent.Platforms, err = grantedPlatforms(o.Creds, o.Agent.Platforms, o.Log); err != nil {
			return err
		}
		o.Agent.QuietHandBacks = !handBacksGranted(o.Creds, o.Agent.Machine, o.Log)
	}
	topts, err := o.TLS.Options()
	if err != nil {
		return fmt.Errorf("%w: %w", agent.ErrConfig, err)
	}
	nc, js, err := Connect(o.NATS, o.Creds, mesh.PrincipalID(mesh.KindAgent, o.Agent.Machine), "build-agent "+o.Agent.Machine, append(topts, Logged(o.Log)...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	// One build agent per machine: it claims node-build-agent at its
	// machine before it pulls. A second agent on the machine is refused;
	// the claim a killed predecessor on this host left is taken at once. A
	// claim that lapsed in a bus outage (or while the agent was stalled)
	// is claimed again under its own token when the bus returns
	// (claim.WithResume): no slot stops pulling for it, the builds in hand
	// go on, and its ask claims are bound again. Only another agent's
	// claim on the machine stops the pulling (the builds in hand go on);
	// the agent never exits for an outage.
	var modules func(string) bool
	if cat != nil {
		o.Agent.Known, modules = knownModules(o.Catalogue, cat, o.Log)
	}
	w := &agent.BuildWorker{
		Sources:  &agent.Sources{Dir: o.Workspace, InsteadOf: o.InsteadOf, MinFree: minFree(o.MinFree)},
		Builder:  bk,
		Registry: o.Registry,
		// A Dockerfile building on a module its build.on does not list
		// is a source error, said at once.
		Modules: modules,
	}
	// The seat claim's renewals are how an idle agent sees a bus that
	// stopped answering without dropping the connection (agent.BusFailed).
	var running atomic.Pointer[agent.Agent]
	busFailed := func() {
		if a := running.Load(); a != nil {
			a.BusFailed()
		}
	}
	st := seat{js: js, seat: mesh.BuildSeat, scope: claim.Node(o.Agent.Machine), holder: claim.Process("build-agent"),
		opts: []claim.Option{claim.WithLease(o.Lease), claim.WithResume(), claim.WithTrouble(busFailed)}, log: o.Log, refuse: true}
	stopping := ctx
	err = st.hold(ctx, func(ctx context.Context, lease *claim.Lease, succeeds *claim.Record) error {
		cfg := o.Agent
		// A seat lost to a bus outage does not cut the builds in hand
		// short; the process stopping does, after its grace.
		cfg.Stopping = stopping
		// The machine's ask claims are bound to its seat claim: when it
		// lapses they are void, and another machine takes its asks at once.
		cfg.SeatToken = lease.Token()
		// The asks a holder that died with the seat left claimed go
		// back at once, not after the ack wait.
		if succeeds != nil {
			cfg.Succeeds = succeeds.Token
		}
		if cfg.State == nil {
			cfg.State = agentState(ctx, js, cfg.Machine, o.Log)
		}
		a, err := agent.New(cfg, js, w, o.Log, o.Observer)
		if err != nil {
			return err
		}
		running.Store(a)
		defer running.Store(nil)
		return a.Run(ctx)
	})
	if errors.Is(err, claim.ErrClaimed) {
		return fmt.Errorf("machine %q already has a build agent: %w: stop that one, or start this one with another --machine", o.Agent.Machine, err)
	}
	return err
}

// ControllerOptions configure the controller process.
type ControllerOptions struct {
	NATS, Creds string
	TLS         TLS
	// Catalogue is the catalogue directory; it is watched for changes.
	Catalogue  string
	Controller cascade.Config
	Observer   cascade.Observer
	// Fleet receives the fleet's metrics (deploy.NewMetrics); nil is
	// Observer when it is a deploy.Observer too (ControllerMetrics's is),
	// else none.
	Fleet deploy.Observer
	// Poll is how often the catalogue directory is checked for changes.
	Poll time.Duration
	Log  *slog.Logger
	// Ready, if set, is closed once the controller has raised the
	// catalogue and serves its tools: once it holds mesh-controller.
	Ready chan<- struct{}
	// Lease is how long the controller's claim of mesh-controller outlives
	// it: the longest a standby waits after it died. 0 is claim.DefaultLease.
	Lease time.Duration
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
	// The fingerprint of the catalogue in use is taken before it is read:
	// a change from then on is seen by the next poll.
	loaded, _ := fingerprint(o.Catalogue)
	cat, err := LoadCatalogue(o.Catalogue, o.Log)
	if err != nil {
		return err
	}
	topts, err := o.TLS.Options()
	if err != nil {
		return fmt.Errorf("%w: %w", cascade.ErrConfig, err)
	}
	nc, js, err := Connect(o.NATS, o.Creds, mesh.ControllerPrincipal, "build-controller", append(topts, Logged(o.Log)...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	// One controller works at a time: it claims mesh-controller, a second
	// stands by and takes over when the first's claim lapses, and one that
	// loses its claim stops (its ctx is cancelled) and stands by again.
	// Waited for while the bus does not answer: a cluster started again
	// whole elects its streams' leaders for seconds (by hand: a farm of
	// three servers killed with kill -9 and started again stopped here).
	if err := mesh.Answered(ctx, o.Log, "raising the claims bucket", func() error {
		return mesh.RaiseClaims(ctx, js, o.Controller.Replicas)
	}); err != nil {
		return err
	}
	ready := sync.OnceFunc(func() {
		if o.Ready != nil {
			close(o.Ready)
		}
	})
	// The plans in flight when the bus lost its store, planned again by
	// the controller that starts over (errStartOver).
	var replans []cascade.Replan
	st := seat{js: js, seat: mesh.ControllerSeat, scope: claim.Mesh(), holder: claim.Process("build-controller"),
		opts: []claim.Option{claim.WithLease(o.Lease), claim.WithRaise(func(ctx context.Context) error {
			// The claims bucket gone with the bus's store: raised again.
			return mesh.RaiseClaims(ctx, js, o.Controller.Replicas)
		})}, log: o.Log}
	return st.hold(ctx, func(ctx context.Context, l *claim.Lease, _ *claim.Record) error {
		// Taking the seat over: the catalogue as it is now.
		if now, err := fingerprint(o.Catalogue); err == nil && now != loaded {
			if fresh, err := LoadCatalogue(o.Catalogue, o.Log); err == nil {
				cat, loaded = fresh, now
			}
		}
		return runController(ctx, o, nc, js, cat, loaded, l.Held, ready, &replans)
	})
}

// wireGone is mesh.WireGone, bounded (a bus that does not answer has not
// said it lost anything) and confirmed by a second look wireRelook later:
// a cluster recovering from a restart of all its servers must not be taken
// for one that lost its store.
func wireGone(js jetstream.JetStream) bool {
	for i := range 2 {
		if i > 0 {
			time.Sleep(wireRelook)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		gone := mesh.WireGone(ctx, js)
		cancel()
		if !gone {
			return false
		}
	}
	return true
}

// wireRelook is how long wireGone waits before its second look.
const wireRelook = 2 * time.Second

// runController runs the controller while it holds mesh-controller.
func runController(ctx context.Context, o ControllerOptions, nc *nats.Conn, js jetstream.JetStream, cat *mesh.Catalogue, fp string, held func() error, ready func(), replans *[]cascade.Replan) error {
	// Its pulls end before its claim can lapse: a controller stopped with
	// its connection open leaves none to take what follows its takeover.
	o.Controller.PullFor = seats.PullForLease(o.Lease)
	c, err := cascade.New(o.Controller, js, cat, o.Log, o.Observer)
	if err != nil {
		return err
	}
	c.SetHeld(held)
	c.Replan(*replans)
	*replans = nil
	// The fleet's side runs beside the cascade, on the same connection:
	// enrolments, assignments, declarations and the nodes' reports.
	dc := deploy.DefaultControllerConfig()
	dc.Module, dc.Replicas, dc.PullFor = o.Controller.Module, o.Controller.Replicas, o.Controller.PullFor
	dc.Raise = false // the cascade raised the wire, the declarations stream with it
	if o.Fleet == nil {
		o.Fleet, _ = o.Observer.(deploy.Observer)
	}
	fleet, err := deploy.NewController(dc, js, cat, o.Log.With("part", "fleet"), o.Fleet)
	if err != nil {
		return err
	}
	fleet.SetHeld(held)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		errc <- c.Run(ctx)
	}()
	if err := waitControllerReady(ctx, nc, c.Module(), errc); err != nil {
		return err
	}
	go func() {
		if err := fleet.Run(ctx); err != nil {
			errc <- fmt.Errorf("the fleet: %w", err)
		}
	}()
	ready()
	t := time.NewTicker(o.Poll)
	defer t.Stop()
	for {
		select {
		case err := <-errc:
			if (err != nil || held() != nil) && nc.IsConnected() && wireGone(js) {
				// A server started again on an empty store (or its
				// streams deleted): the plans, asks and claims it held
				// are gone, and what the controller works on failed with
				// them. It raises the wire again and starts over, planning
				// again the plans it was running; the machines take asks
				// again once their queues are back.
				cancel()
				<-ran
				*replans = c.Running()
				o.Log.Error("the bus has lost the farm's streams (a NATS server started again on an empty store?): raising them again and starting over, the plans in flight planned again",
					"plans", len(*replans), "err", err)
				return errStartOver
			}
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
		// Each ask bounded: a predecessor stopped with its connection open
		// (SIGSTOP) still has its tools' subscriptions at the server, so an
		// ask made before this controller serves is not refused (no
		// responders) but taken by it and never answered — and with the
		// tools' 30 s the fleet's side started that much late
		// (TestAStandbyTakingOverFromAFrozenControllerIsDeliveredWhatFollows).
		cctx, cancel := context.WithTimeout(ctx, readyAskFor)
		_, err := cascade.Call(cctx, nc, module, cascade.ToolRetry, cascade.Request{Plan: "-"})
		cancel()
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

// readyAskFor bounds each of waitControllerReady's asks.
const readyAskFor = time.Second

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

// knownModules says whether the catalogue in dir, cat when the agent
// started, builds a module. The directory is read again before a module is
// refused, so a module added since is accepted; while the directory has
// problems the last good catalogue is kept. has says the same of the
// catalogue last read, without reading it again (for names that are
// mostly not modules: the images a Dockerfile builds FROM).
func knownModules(dir string, cat *mesh.Catalogue, log *slog.Logger) (known, has func(string) bool) {
	var mu sync.Mutex
	builds := func(c *mesh.Catalogue, m string) bool {
		man, ok := c.Module(m)
		return ok && man.Build != nil
	}
	known = func(m string) bool {
		mu.Lock()
		defer mu.Unlock()
		if builds(cat, m) {
			return true
		}
		fresh, err := LoadCatalogue(dir, slog.New(slog.DiscardHandler))
		if err != nil {
			log.Warn("the catalogue has problems: keeping the last good one", "dir", dir, "err", catalogueProblem(dir, err))
		} else {
			cat = fresh
		}
		return builds(cat, m)
	}
	has = func(m string) bool {
		mu.Lock()
		defer mu.Unlock()
		return builds(cat, m)
	}
	return known, has
}

// catalogueRetry is how often an agent tries a catalogue that could not be
// used again.
const catalogueRetry = 5 * time.Second

// agentCatalogue loads the agent's catalogue, failing closed: while it
// cannot be used (a directory missing or empty, a manifest that does not
// parse or check) the agent takes no asks. It says so in one line naming
// the file and the problem and when it tries again, says it again only if
// the problem changes, and tries every retry until it loads or ctx ends.
func agentCatalogue(ctx context.Context, dir string, retry time.Duration, log *slog.Logger) (*mesh.Catalogue, error) {
	said := ""
	for {
		cat, err := LoadCatalogue(dir, slog.New(slog.DiscardHandler))
		if err == nil {
			if said != "" {
				log.Info("the catalogue loads now: taking asks", "dir", dir)
			}
			return cat, nil
		}
		why := catalogueProblem(dir, err)
		if why != said {
			log.Error(fmt.Sprintf("the catalogue cannot be used: %s; taking no asks until it loads, trying again every %s", why, retry), "dir", dir)
			said = why
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(retry):
		}
	}
}

// catalogueProblem is what is wrong with the catalogue in dir, in one
// line naming the file: the load's error, or the first problem of the
// check (with how many more, and the command that lists them).
func catalogueProblem(dir string, err error) string {
	if !errors.Is(err, ErrCatalogue) {
		return err.Error()
	}
	_, problems, lerr := mesh.Load(dir)
	if lerr != nil {
		return lerr.Error()
	}
	var errs []string
	for _, p := range problems {
		if !p.Warning {
			errs = append(errs, p.String())
		}
	}
	switch len(errs) {
	case 0:
		return err.Error()
	case 1:
		return errs[0]
	default:
		return fmt.Sprintf("%s (and %d more: run `builds catalogue check %s`)", errs[0], len(errs)-1, dir)
	}
}

// workerPlatforms asks buildkitd which platforms its worker builds,
// waiting (with backoff, said in the log) while it does not answer: a
// daemon that is down at start is no reason to exit.
func workerPlatforms(ctx context.Context, bk *agent.BuildKit, log *slog.Logger) ([]string, error) {
	retry := backoff.Policy{First: time.Second, Max: 30 * time.Second}
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		worker, err := bk.Platforms(pctx)
		cancel()
		if err == nil {
			return worker, nil
		}
		log.Warn("buildkitd does not say which platforms it builds; asking again", "err", err, "attempt", attempt)
		if err := backoff.Wait(ctx, retry.Delay(attempt)); err != nil {
			return nil, err
		}
	}
}

// cataloguePlatforms keeps, of the worker's platforms, those the catalogue
// builds for (each has a queue of its own); all of them when it shares
// none.
func cataloguePlatforms(cat *mesh.Catalogue, worker []string, log *slog.Logger) []string {
	builds := map[string]bool{}
	for _, p := range cat.Platforms() {
		if n, err := mesh.NormalizePlatform(p); err == nil {
			builds[n] = true
		}
	}
	var keep []string
	for _, p := range worker {
		if n, err := mesh.NormalizePlatform(p); err == nil && builds[n] {
			keep = append(keep, p)
		}
	}
	if len(keep) == 0 {
		return worker
	}
	if len(keep) < len(worker) {
		log.Info("taking asks for the platforms the catalogue builds", "platforms", keep, "worker", worker)
	}
	return keep
}

// minFree is AgentOptions.MinFree as agent.Sources takes it.
func minFree(n int64) int64 {
	switch {
	case n == 0:
		return agent.DefaultMinFree
	case n < 0:
		return 0
	}
	return n
}
