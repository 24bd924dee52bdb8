package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/seat"
	"github.com/meshbuild/meshbuild/state"
)

// RunFunc runs a module the runtime carries in-process until ctx is done;
// stopping it must hand back whatever work it holds. ctx carries the
// module's state surface: state.FromContext.
type RunFunc func(ctx context.Context) error

// NodeConfig configures a node runtime. DefaultNodeConfig fills defaults;
// Validate refuses what cannot work.
type NodeConfig struct {
	// Name is the node's name: its subject token and its consumer's name.
	Name string
	// Identity names the machine; empty reads (or makes) one in StateDir.
	Identity string
	// Platforms the node runs.
	Platforms []string
	// StateDir keeps the applied revision, the identity and the image
	// layout.
	StateDir string
	// ApplyHook, when set, is run for each module applied or removed,
	// with MESHBUILD_MODULE, MESHBUILD_IMAGE, MESHBUILD_DIGEST,
	// MESHBUILD_REVISION, MESHBUILD_ACTION (apply|remove),
	// MESHBUILD_LAYOUT and, for a module issued buckets,
	// MESHBUILD_STATE_SOCKET (its state socket) in its environment.
	ApplyHook string
	// Registry is the client images are pulled with; nil is
	// registry.NewClient() (credentials from the docker config).
	Registry *registry.Client
	// Heartbeat is how often the node tells the controller it is alive.
	Heartbeat time.Duration
	// RetryDelay is how long a declaration that failed to apply waits
	// before it is tried again.
	RetryDelay time.Duration
	// Carried are the modules the runtime runs itself (build-agent).
	Carried map[string]RunFunc
}

// DefaultNodeConfig returns the defaults.
func DefaultNodeConfig() NodeConfig {
	return NodeConfig{Heartbeat: 30 * time.Second, RetryDelay: time.Minute, Carried: map[string]RunFunc{}}
}

// Validate refuses a config that cannot work.
func (c NodeConfig) Validate() error {
	if err := mesh.ValidMachineName(mesh.KindNode, c.Name); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	switch {
	case c.StateDir == "":
		return fmt.Errorf("%w: no state directory: set --state DIR (it keeps the applied revision)", ErrConfig)
	case c.Heartbeat <= 0 || c.RetryDelay <= 0:
		return fmt.Errorf("%w: heartbeat and retry delay must be positive", ErrConfig)
	}
	return nil
}

// ErrRefused is returned when the controller refuses the node's enrolment.
var ErrRefused = errors.New("enrolment refused")

// Node is the runtime of one machine: it enrols, reads its declarations from
// its own consumer, applies the newest and reports to mesh-controller.
type Node struct {
	cfg NodeConfig
	nc  *nats.Conn
	js  jetstream.JetStream
	log *slog.Logger
	obs Observer

	mu      sync.Mutex
	applied appliedState
	// declared is the newest revision the node was given (since it
	// started; the applied one before any).
	declared uint64

	running map[string]*carried
	// states are the state surfaces of the modules declared, by module;
	// sockets serve those of modules out of process.
	states  map[string]*state.Store
	sockets map[string]*carried
}

type carried struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// appliedState is what the node keeps in its state dir.
type appliedState struct {
	Revision uint64          `json:"revision"`
	Modules  []AppliedModule `json:"modules"`
	// Declaration is the declaration applied, which a node started again
	// resumes (its consumer has acknowledged it and delivers only newer
	// ones). A file kept before it was recorded has none.
	Declaration *Declaration `json:"declaration,omitempty"`
}

// NewNode returns a node runtime.
func NewNode(cfg NodeConfig, js jetstream.JetStream, log *slog.Logger, obs Observer) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if js == nil {
		return nil, fmt.Errorf("%w: a JetStream handle is required", ErrConfig)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if obs == nil {
		obs = nopObserver{}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: state directory: %v", ErrConfig, err)
	}
	if cfg.Identity == "" {
		id, err := identity(cfg.StateDir)
		if err != nil {
			return nil, err
		}
		cfg.Identity = id
	}
	n := &Node{cfg: cfg, nc: js.Conn(), js: js, log: log.With("node", cfg.Name), obs: obs, running: map[string]*carried{},
		states: map[string]*state.Store{}, sockets: map[string]*carried{}}
	data, err := os.ReadFile(n.statePath())
	if err == nil {
		if err := json.Unmarshal(data, &n.applied); err != nil {
			return nil, fmt.Errorf("%w: %s is unreadable (%v): remove it to apply the next declaration afresh", ErrConfig, n.statePath(), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	n.declared = n.applied.Revision
	n.obs.Revisions(n.declared, n.applied.Revision)
	return n, nil
}

// identity reads the machine's identity from dir, making one the first time.
func identity(dir string) (string, error) {
	file := filepath.Join(dir, "identity")
	if data, err := os.ReadFile(file); err == nil && len(strings.TrimSpace(string(data))) > 0 {
		return strings.TrimSpace(string(data)), nil
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	if err := os.WriteFile(file, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("writing the machine identity: %w", err)
	}
	return id, nil
}

func (n *Node) statePath() string  { return filepath.Join(n.cfg.StateDir, "applied.json") }
func (n *Node) layoutPath() string { return filepath.Join(n.cfg.StateDir, "images") }

// Identity is the machine identity the node enrols with.
func (n *Node) Identity() string { return n.cfg.Identity }

// StateDir is where the node keeps its applied revision and images.
func (n *Node) StateDir() string { return n.cfg.StateDir }

// Applied is the revision the node has applied.
func (n *Node) Applied() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.applied.Revision
}

// Running reports whether a carried module runs now.
func (n *Node) Running(module string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.running[module]
	return ok
}

// Run enrols, then applies declarations until ctx is done; carried modules
// are stopped (handing back what they hold) before it returns.
func (n *Node) Run(ctx context.Context) error {
	if err := n.Enrol(ctx); err != nil {
		return err
	}
	defer n.stopAll()
	consume := func() (*seat.Consumption, error) {
		decls, err := seat.Consume(ctx, n.js, mesh.NodesStream, mesh.NodeConsumer(n.cfg.Name), 1, "declarations", n.log, seat.EndWhenGone())
		if err != nil {
			return nil, fmt.Errorf("node %s (the controller creates its consumer at enrolment): %w", n.cfg.Name, err)
		}
		return decls, nil
	}
	decls, err := consume()
	if err != nil {
		return err
	}
	defer func() { decls.Stop() }()
	n.resume(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { n.heartbeats(ctx) })
	n.log.Info("node running", "applied", n.Applied())
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg, ok := <-decls.Messages():
			if ok {
				n.Apply(ctx, msg)
				continue
			}
			if ctx.Err() != nil || decls.Err() == nil {
				return nil
			}
			if !errors.Is(decls.Err(), seat.ErrConsumerGone) {
				return fmt.Errorf("reading declarations: %w", decls.Err())
			}
			// The bus lost its store: the controller knows the node no
			// more. It enrols again (the controller makes its consumer
			// again), keeping what it runs; the next declaration is
			// numbered above what it applied (it says it at enrolment).
			n.log.Warn("the declarations consumer is gone from the bus (a server started again on an empty store?): enrolling again; what this node runs goes on")
			decls.Stop()
			if err := n.enrolAgain(ctx); err != nil {
				return err
			}
			if decls, err = consume(); err != nil {
				return err
			}
		}
	}
}

// Enrol asks the mesh-controller seat to enrol the node and waits for the
// answer at the address the payload names.
func (n *Node) Enrol(ctx context.Context) error {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	reply := mesh.NodeAnswerSubject(n.cfg.Name, hex.EncodeToString(b))
	sub, err := n.nc.SubscribeSync(reply)
	if err != nil {
		return fmt.Errorf("listening for the enrolment answer on %s: %w", reply, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	data, _ := json.Marshal(Enrol{Version: WireVersion, Node: n.cfg.Name, Identity: n.cfg.Identity, Platforms: n.cfg.Platforms, Reply: reply, Applied: n.Applied()})
	// Sent again under the same id while no answer comes: the queue's
	// duplicate window drops the copy of one still queued (no controller
	// yet), and takes one whose first was lost with the bus's store.
	publish := func() error {
		_, err := n.js.Publish(ctx, mesh.SeatAcceptSubject(mesh.ControllerSeat, mesh.EnrolVerb), data, jetstream.WithMsgID(reply))
		return err
	}
	if err := publish(); err != nil {
		return fmt.Errorf("enrolling with %s: %w", mesh.ControllerSeat, err)
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, enrolWait)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			n.log.Info("waiting for the controller to answer the enrolment (it stays queued until one does)")
			if err := publish(); err != nil {
				n.log.Warn("enrolling again", "err", err)
			}
			continue
		}
		var a EnrolAnswer
		if err := json.Unmarshal(m.Data, &a); err != nil {
			return fmt.Errorf("decoding the enrolment answer: %w", err)
		}
		if !a.OK {
			return fmt.Errorf("%w: %s", ErrRefused, a.Error)
		}
		n.log.Info("enrolled", "new", a.Created)
		return nil
	}
}

// enrolWait is how long an enrolment waits for its answer before it is
// sent again.
const enrolWait = 15 * time.Second

// enrolAgain enrols until the controller answers: while the bus has no
// seat queue to take the enrolment (the controller raises it as it starts
// over), it tries again. A refusal ends it.
func (n *Node) enrolAgain(ctx context.Context) error {
	retry := backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		err := n.Enrol(ctx)
		if err == nil || errors.Is(err, ErrRefused) || ctx.Err() != nil {
			return err
		}
		n.log.Warn("enrolling again: the controller's queue is not there yet; trying again", "err", err, "attempt", attempt)
		if err := backoff.Wait(ctx, retry.Delay(attempt)); err != nil {
			return err
		}
	}
}

func (n *Node) heartbeats(ctx context.Context) {
	t := time.NewTicker(n.cfg.Heartbeat)
	defer t.Stop()
	for {
		n.beat()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// beat sends one heartbeat; it is not waited for (a lost one is replaced by
// the next).
func (n *Node) beat() {
	n.mu.Lock()
	r := Report{Version: WireVersion, Kind: Heartbeat, Node: n.cfg.Name, Revision: n.applied.Revision, Applied: n.applied.Revision,
		Modules: slices.Clone(n.applied.Modules), At: time.Now().UTC()}
	n.mu.Unlock()
	data, _ := json.Marshal(r)
	if err := n.nc.Publish(mesh.SeatAcceptSubject(mesh.ControllerSeat, mesh.ReportVerb), data); err != nil {
		n.log.Warn("heartbeat", "err", err)
	}
}

// Apply works one declaration: refuse it if it is not newer than what was
// applied, else pull, verify and apply each module, report, and only then
// acknowledge it. The revision lag is told on seeing it and after its
// outcome, whatever the outcome.
func (n *Node) Apply(ctx context.Context, msg jetstream.Msg) {
	start := time.Now()
	var d Declaration
	if err := decode(msg.Data(), &d); err != nil || d.Node != n.cfg.Name {
		n.log.Error("refusing a declaration that is not this node's", "subject", msg.Subject(), "for", d.Node, "err", err)
		_ = msg.Term()
		return
	}
	applied := n.seen(d.Revision)
	if d.Revision <= applied {
		n.log.Warn("refusing a stale declaration", "revision", d.Revision, "applied", applied)
		n.outcome(Refused, start)
		n.settle(ctx, msg, Report{Kind: Refused, Revision: d.Revision, Applied: applied,
			Reason: fmt.Sprintf("revision %d is at or below the applied revision %d", d.Revision, applied)}, start)
		return
	}
	stop := make(chan struct{})
	go func() { // applying outlasts no ack wait
		t := time.NewTicker(mesh.NodeAckWait / 5)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	mods, err := n.apply(ctx, d)
	close(stop)
	if err != nil {
		n.log.Error("applying a declaration failed", "revision", d.Revision, "err", err)
		n.outcome(Failed, start)
		if err := n.report(ctx, Report{Kind: Failed, Revision: d.Revision, Applied: applied, Reason: err.Error()}, start); err != nil {
			n.log.Warn("reporting a failed apply", "err", err)
		}
		_ = msg.NakWithDelay(n.cfg.RetryDelay)
		return
	}
	n.mu.Lock()
	n.applied = appliedState{Revision: d.Revision, Modules: mods, Declaration: &d}
	n.mu.Unlock()
	if err := n.save(); err != nil {
		n.log.Error("keeping the applied revision", "err", err)
	}
	n.log.Info("applied", "revision", d.Revision, "modules", len(mods), "took", time.Since(start).Round(time.Millisecond))
	n.outcome(Applied, start)
	n.settle(ctx, msg, Report{Kind: Applied, Revision: d.Revision, Applied: d.Revision, Modules: mods}, start)
}

// resume runs again what the applied declaration declares, as the node had
// it before it stopped: its carried modules started, the state of its
// modules served. An image applied is not pulled or handed to the apply
// hook again (apply does that only for a digest that changed). A file kept
// without the declaration resumes from the modules it lists, issued no
// buckets until the next declaration.
func (n *Node) resume(ctx context.Context) {
	n.mu.Lock()
	d, applied := n.applied.Declaration, n.applied
	n.mu.Unlock()
	if d == nil {
		if len(applied.Modules) == 0 {
			return
		}
		d = &Declaration{Version: WireVersion, Node: n.cfg.Name, Revision: applied.Revision}
		for _, m := range applied.Modules {
			d.Modules = append(d.Modules, DeclaredModule{Module: m.Module, Digest: m.Digest})
		}
	}
	if _, err := n.apply(ctx, *d); err != nil {
		n.log.Error("resuming the applied declaration", "revision", d.Revision, "err", err)
		return
	}
	n.log.Info("resumed the applied declaration", "revision", d.Revision, "modules", len(d.Modules))
}

// seen notes a declaration of revision rev, tells the revisions, and
// returns the revision applied.
func (n *Node) seen(rev uint64) (applied uint64) {
	n.mu.Lock()
	n.declared = max(n.declared, rev)
	declared, applied := n.declared, n.applied.Revision
	n.mu.Unlock()
	n.obs.Revisions(declared, applied)
	return applied
}

// outcome tells a declaration's outcome and the revisions after it.
func (n *Node) outcome(kind string, start time.Time) {
	n.obs.Applied(kind, time.Since(start))
	n.mu.Lock()
	declared, applied := n.declared, n.applied.Revision
	n.mu.Unlock()
	n.obs.Revisions(declared, applied)
}

// settle reports, then acknowledges; a report that could not be sent leaves
// the declaration to be delivered again.
func (n *Node) settle(ctx context.Context, msg jetstream.Msg, r Report, start time.Time) {
	if err := n.report(ctx, r, start); err != nil {
		n.log.Warn("reporting; the declaration will come again", "err", err)
		_ = msg.NakWithDelay(n.cfg.RetryDelay)
		return
	}
	if err := msg.DoubleAck(ctx); err != nil {
		n.log.Warn("acknowledging the declaration", "err", err)
	}
}

func (n *Node) report(ctx context.Context, r Report, start time.Time) error {
	r.Version, r.Node, r.At, r.Took = WireVersion, n.cfg.Name, time.Now().UTC(), time.Since(start)
	data, _ := json.Marshal(r)
	_, err := n.js.Publish(ctx, mesh.SeatAcceptSubject(mesh.ControllerSeat, mesh.ReportVerb), data)
	return err
}

func (n *Node) save() error {
	n.mu.Lock()
	data, _ := json.MarshalIndent(n.applied, "", "  ")
	n.mu.Unlock()
	tmp := n.statePath() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, n.statePath())
}

// apply makes the node run what d declares and returns the modules as
// applied.
func (n *Node) apply(ctx context.Context, d Declaration) ([]AppliedModule, error) {
	n.mu.Lock()
	before := map[string]AppliedModule{}
	for _, m := range n.applied.Modules {
		before[m.Module] = m
	}
	n.mu.Unlock()
	var out []AppliedModule
	want := map[string]bool{}
	for _, m := range d.Modules {
		want[m.Module] = true
		st := n.issue(m)
		if run, ok := n.cfg.Carried[m.Module]; ok {
			n.start(ctx, m.Module, func(ctx context.Context) error { return run(state.NewContext(ctx, st)) })
			out = append(out, AppliedModule{Module: m.Module, Digest: m.Digest, Carried: true})
			continue
		}
		if err := n.serveState(ctx, m.Module, st, len(m.Buckets) > 0); err != nil {
			return nil, err
		}
		if m.Ref() == "" {
			n.log.Warn("module has no image yet; nothing to apply", "module", m.Module)
			out = append(out, AppliedModule{Module: m.Module})
			continue
		}
		if before[m.Module].Digest != m.Digest {
			if err := Pull(ctx, n.layoutPath(), m.Ref(), n.cfg.Registry); err != nil {
				return nil, fmt.Errorf("module %s: %w", m.Module, err)
			}
			if err := n.hook(ctx, "apply", m, d.Revision); err != nil {
				return nil, err
			}
		}
		out = append(out, AppliedModule{Module: m.Module, Digest: m.Digest})
	}
	for name, m := range before {
		if want[name] {
			continue
		}
		if m.Carried {
			n.stop(name)
			continue
		}
		if err := n.hook(ctx, "remove", DeclaredModule{Module: name, Digest: m.Digest}, d.Revision); err != nil {
			return nil, err
		}
		n.stopSocket(name)
	}
	n.mu.Lock()
	for name := range n.states {
		if !want[name] {
			delete(n.states, name)
		}
	}
	n.mu.Unlock()
	// A carried module started by an earlier run of this process and no
	// longer declared.
	for name := range n.cfg.Carried {
		if !want[name] {
			n.stop(name)
		}
	}
	return out, nil
}

func (n *Node) hook(ctx context.Context, action string, m DeclaredModule, revision uint64) error {
	if n.cfg.ApplyHook == "" {
		return nil
	}
	cmd := exec.CommandContext(ctx, n.cfg.ApplyHook)
	cmd.Env = append(os.Environ(),
		"MESHBUILD_ACTION="+action, "MESHBUILD_MODULE="+m.Module, "MESHBUILD_IMAGE="+m.Ref(),
		"MESHBUILD_DIGEST="+m.Digest, "MESHBUILD_REVISION="+strconv.FormatUint(revision, 10),
		"MESHBUILD_LAYOUT="+n.layoutPath(), "MESHBUILD_NODE="+n.cfg.Name)
	if len(m.Buckets) > 0 {
		cmd.Env = append(cmd.Env, state.SocketEnv+"="+state.SocketPath(n.cfg.StateDir, m.Module))
	}
	// A hook that starts a process and leaves it running (`app &`) leaves
	// it its output: the hook is done when it exits, and what is left of
	// its output is not waited for past hookOutputWait. A context that
	// ends kills the hook and what it started (its process group).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = hookOutputWait
	out, err := cmd.CombinedOutput()
	if err != nil && !(errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState.Success()) {
		return fmt.Errorf("apply hook %s (%s %s): %w: %s", n.cfg.ApplyHook, action, m.Module, err, lastLines(string(out), 5))
	}
	return nil
}

// hookOutputWait is how long the output of an apply hook that exited is
// waited for (a process it left running holds it).
const hookOutputWait = 2 * time.Second

func lastLines(s string, k int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > k {
		lines = lines[len(lines)-k:]
	}
	return strings.Join(lines, " | ")
}

// carriedRestart is how long a carried module that stopped waits before it
// is started again: 1s, doubled per stop in a row, at most 30s.
var carriedRestart = backoff.Policy{First: time.Second, Max: 30 * time.Second}

// start runs a carried module unless it runs already. It lives as long as
// the node runs (ctx), or until it is unassigned.
func (n *Node) start(ctx context.Context, module string, run RunFunc) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.running[module]; ok {
		return
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &carried{cancel: cancel, done: make(chan struct{})}
	n.running[module] = c
	n.log.Info("starting a carried module", "module", module)
	go func() {
		defer close(c.done)
		// While it is declared, a carried module that stops is started
		// again, as a service manager would: a build agent refused its
		// machine's seat because the claim of the agent before it (a node
		// killed and started again) has not lapsed yet takes it once it
		// has.
		for attempt := 1; ; attempt++ {
			began := time.Now()
			err := run(cctx)
			if cctx.Err() != nil {
				return
			}
			if time.Since(began) > carriedRestart.Max {
				attempt = 1 // it ran a while: a new failure, not the same one
			}
			d := carriedRestart.Delay(attempt)
			n.log.Error("carried module stopped; starting it again", "module", module, "err", err, "in", d)
			if backoff.Wait(cctx, d) != nil {
				return
			}
			n.log.Info("starting a carried module again", "module", module, "attempt", attempt+1)
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			cancel()
		case <-c.done:
		}
	}()
}

// stop stops a carried module and waits until it has handed back what it
// held.
func (n *Node) stop(module string) {
	n.mu.Lock()
	c, ok := n.running[module]
	delete(n.running, module)
	n.mu.Unlock()
	if !ok {
		return
	}
	n.log.Info("stopping a carried module", "module", module)
	c.cancel()
	<-c.done
}

func (n *Node) stopAll() {
	n.mu.Lock()
	names := make([]string, 0, len(n.running))
	for m := range n.running {
		names = append(names, m)
	}
	sockets := make([]string, 0, len(n.sockets))
	for m := range n.sockets {
		sockets = append(sockets, m)
	}
	n.mu.Unlock()
	for _, m := range names {
		n.stop(m)
	}
	for _, m := range sockets {
		n.stopSocket(m)
	}
}
