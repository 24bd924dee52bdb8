package cascade_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/registry"
)

// Crash anywhere: the controller, and separately the agents, are killed at
// random points of their plans, over and over, each restarted at once, and
// after every round of plans the invariants are checked against the
// server's and the registry's own records, never the controller's word
// alone.
//
// A kill is a real one. Every controller and agent connection runs through
// a tap (a net.Conn around the TCP socket) that reads the client protocol
// the process writes and, at the armed point, lets through exactly the bytes
// before (or up to the end of) the n-th message of a kind, closes the socket
// and cancels the process's context: the server sees what a process killed
// at that instant would have sent, then a dropped connection with its
// unacknowledged messages. The kinds are what a flush writes, in order: the
// KV writes of the plan state (persist, and plan creation), the asks
// (publish), the acks of the batch's events, the purges of old plans
// (prune); an agent's started, built and acks; and, inside the agent's
// builder, before and after its push.
//
// The agents are the real holder loop (package agent) on the real server;
// their builder is fast and fake: it pushes a small reproducible image,
// labelled with its ask, to a real in-process registry (registry.New) that
// counts the manifests it receives.
//
// Some rounds also take the registry away (it answers 503 to everything)
// or the bus (the server stopped, and started again on its store and port)
// for up to 1.7 s at a random point: pushes and the controller's checks of
// built digests fail on infrastructure and are tried again, and every
// process rides out the bus's outage on its own reconnecting connection.
//
// The redelivery timer of a killed process's messages is the consumers'
// ack wait (30 s in production): the test shortens it on the server after
// each controller start, so that a round takes seconds. It is the same
// redelivery, sooner.
//
// Seeded: a failure prints the seed; -chaos.seed=N or MESHBUILD_CHAOS_SEED=N
// replays the same kill schedule (the interleaving of real goroutines is
// not replayed). The short run is a few plans; MESHBUILD_CHAOS=N (or
// -chaos.plans=N) runs N plans.

var (
	chaosSeed  = flag.Uint64("chaos.seed", 0, "seed of TestCrashAnywhere's kill schedule (default: MESHBUILD_CHAOS_SEED, else random)")
	chaosPlans = flag.Int("chaos.plans", 0, "plans TestCrashAnywhere runs (default: MESHBUILD_CHAOS, else a short run)")
)

const (
	chaosShortPlans = 8
	// chaosAckWait is the consumers' ack wait during the test.
	chaosAckWait = time.Second
	// chaosClaimLease is the agents' claims' lease: a killed agent's ask
	// claim lapses that soon, and so does a live one's while the bus is
	// away for longer.
	chaosClaimLease = time.Second
	// chaosSettle bounds one round.
	chaosSettle = 45 * time.Second
)

// chaosGraph: a diamond with a tail and a fan, six modules a plan.
var chaosGraph = map[string][]string{
	"a": nil, "b": {"a"}, "c": {"a"}, "d": {"b", "c"}, "e": {"d"}, "f": {"a"},
}

func chaosConfig(t *testing.T) (seed uint64, plans int) {
	seed = *chaosSeed
	if seed == 0 {
		if v := os.Getenv("MESHBUILD_CHAOS_SEED"); v != "" {
			s, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("MESHBUILD_CHAOS_SEED=%q: want a number", v)
			}
			seed = s
		}
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	plans = *chaosPlans
	if plans == 0 {
		if v := os.Getenv("MESHBUILD_CHAOS"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("MESHBUILD_CHAOS=%q: want a number of plans, 1 or more", v)
			}
			plans = n
		}
	}
	if plans == 0 {
		plans = chaosShortPlans
	}
	return seed, plans
}

func TestCrashAnywhere(t *testing.T) {
	seed, plans := chaosConfig(t)
	crashAnywhere(t, seed, plans)
}

// TestCrashAnywhereRegressions replays the kill schedules of seeds that
// found a bug (the goroutines' interleaving is not replayed, so each is
// run a few times).
func TestCrashAnywhereRegressions(t *testing.T) {
	for _, c := range []struct {
		seed  uint64
		plans int
		bug   string
	}{
		// A kill mid-persist stored a plan's record as built before the
		// current image of its last module (current.d stayed the older
		// plan's), or a dependent as queued before its base as built (the
		// dependent was asked for again with no digest for its base, and
		// failed{ask}): the store's keys are written in parallel.
		{1796025977057929803, 2, "a partial persist"},
	} {
		t.Run(fmt.Sprint(c.seed), func(t *testing.T) {
			for range 3 {
				crashAnywhere(t, c.seed, c.plans)
			}
		})
	}
}

// TestANewerPushWinsOverAnOlderRedelivered: the controller dies with a push
// in hand, before making its plan; a newer push arrives at the restarted
// controller before the older one is delivered again. The newer push's
// images must still be current.
func TestANewerPushWinsOverAnOlderRedelivered(t *testing.T) {
	f := newChaosFarm(t, 1)
	push := func(commit string) string {
		id, _, err := cascade.Push(context.Background(), f.js, mesh.Pushed{Repo: meshtest.FleetRepo, Ref: "refs/heads/main", Commit: commit})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	f.ctrl.arm([]killTarget{{kind: kindKVCreate, n: 1}})
	older := push("older")
	testenv.WaitFor(t, 10*time.Second, "the controller to die making the older plan", func() bool { return f.kills.total() == 1 })
	newer := push("newer")
	f.waitSettled("both plans", []string{older, newer})
	testenv.WaitFor(t, chaosSettle, "the controller's events and the queue drained", f.drained)
	// The newer push to the same branch supersedes what the older plan
	// had not started (the scheduler's supersede): the older plan settles
	// with those modules superseded, and only the newer one is built in
	// full. Either way the newer plan's images are current (check).
	rec, err := f.store.Plan(context.Background(), older)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Counts.Superseded > 0 {
		if rec.Outcome != cascade.OutcomeBuilt || rec.Counts.Built+rec.Counts.Superseded != len(chaosGraph) {
			t.Fatalf("the older plan settled %s %+v, want every module built or superseded", rec.Outcome, rec.Counts)
		}
		f.check(1, []string{newer})
		return
	}
	f.check(1, []string{older, newer})
}

func crashAnywhere(t *testing.T, seed uint64, plans int) {
	t.Logf("seed %d, %d plans (replay: MESHBUILD_CHAOS_SEED=%d MESHBUILD_CHAOS=%d go test -race -run TestCrashAnywhere ./cascade/)", seed, plans, seed, plans)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: replay with MESHBUILD_CHAOS_SEED=%d MESHBUILD_CHAOS=%d go test -race -run TestCrashAnywhere ./cascade/", seed, seed, plans)
		}
	})
	f := newChaosFarm(t, seed)
	begun := time.Now()
	done := 0
	for round := 1; done < plans; round++ {
		n := min(plans-done, 1+f.rng.IntN(3))
		f.round(round, n)
		done += n
	}
	t.Logf("%d plans in %s; %s", done, time.Since(begun).Round(time.Millisecond), f.kills.summary())
}

// --- the farm -------------------------------------------------------------

type chaosFarm struct {
	t   *testing.T
	rng *rand.Rand
	// faults draws the round's outages (of the registry, of the bus): a
	// stream of its own, so that the kill schedules of recorded seeds
	// (TestCrashAnywhereRegressions) stay what they were.
	faults *rand.Rand
	bus    *natstest.TestCluster
	nc     *nats.Conn
	js     jetstream.JetStream
	cat    *mesh.Catalogue
	reg    *countingRegistry
	kills  *killCounts
	store  *cascade.Store

	ctrl   *supervisor
	agents []*supervisor
	builds *chaosBuilds

	// built is every built event read from EVENTS so far, by plan/module,
	// up to stream sequence builtSeq.
	built    map[string][]mesh.Built
	builtSeq uint64
}

func newChaosFarm(t *testing.T, seed uint64) *chaosFarm {
	bus := natstest.Single(t)
	nc, js := bus.Connect(t, nats.Name("test"))
	f := &chaosFarm{
		t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), faults: rand.New(rand.NewPCG(seed^0xfa175, seed)),
		bus: bus, nc: nc, js: js,
		cat: meshtest.Catalogue(t, chaosGraph), reg: newCountingRegistry(t), kills: &killCounts{n: map[string]int{}},
		builds: &chaosBuilds{calls: map[string]int{}, orphans: map[string]int{}, holding: map[string]map[string]bool{}, retried: map[string]int{}},
		built:  map[string][]mesh.Built{},
	}
	f.ctrl = f.supervise("controller", false, f.runController)
	st, err := cascade.OpenStore(context.Background(), js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
	f.store = st
	for _, m := range []string{"m1", "m2"} {
		f.agents = append(f.agents, f.supervise(m, true, f.runAgent(m)))
	}
	return f
}

// supervisor runs one process (the controller, or an agent), starting it
// again at once each time its tap kills it, until the test ends.
type supervisor struct {
	name  string
	agent bool
	f     *chaosFarm
	run   func(ctx context.Context, nc *nats.Conn, tp *tap, ready func()) error

	mu      sync.Mutex
	tap     *tap
	targets []killTarget // armed on the next incarnations, in order
}

func (f *chaosFarm) supervise(name string, agent bool, run func(ctx context.Context, nc *nats.Conn, tp *tap, ready func()) error) *supervisor {
	sv := &supervisor{name: name, agent: agent, f: f, run: run}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	first := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			sv.incarnation(ctx, func() { once.Do(func() { close(first) }) })
		}
	}()
	f.t.Cleanup(func() { cancel(); <-done })
	select {
	case <-first:
	case <-time.After(20 * time.Second):
		f.t.Fatalf("%s did not start in 20s", name)
	}
	return sv
}

// incarnation runs the process once, until it is killed or the test ends.
// A killed incarnation's goroutines wind down in the background: its tap
// refuses every byte they write, and the next one starts at once.
func (sv *supervisor) incarnation(parent context.Context, ready func()) {
	ctx, cancel := context.WithCancel(parent)
	died := make(chan struct{})
	tp := &tap{who: sv.name, counts: map[string]int{}}
	tp.onKill = func() {
		if sv.agent {
			sv.f.builds.killed(sv.name)
		}
		cancel()
		close(died)
	}
	if sv.agent {
		tp.onSettled = func(ask string) { sv.f.builds.released(sv.name, ask) }
	}
	sv.mu.Lock()
	if len(sv.targets) > 0 {
		tp.target, sv.targets = sv.targets[0], sv.targets[1:]
	}
	sv.tap = tp
	sv.mu.Unlock()
	// A process rides out an outage of the bus (it reconnects, as a real
	// one does); a killed one does not (its tap refuses to dial).
	nc, err := nats.Connect(sv.f.bus.URLs(), nats.SetCustomDialer(tp), nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Name(sv.name),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the kill is the test's
	if err != nil {
		cancel()
		sv.f.t.Errorf("%s: connecting: %v", sv.name, err)
		<-parent.Done()
		return
	}
	ran := make(chan error, 1)
	go func() {
		err := sv.run(ctx, nc, tp, ready)
		nc.Close()
		ran <- err
	}()
	select {
	case <-died:
	case err = <-ran:
		if _, killed := tp.killedAt(); !killed {
			cancel()
			if parent.Err() == nil {
				sv.f.t.Errorf("%s stopped without being killed: %v", sv.name, err)
				<-parent.Done()
			}
			return
		}
	}
	point, _ := tp.killedAt()
	sv.f.kills.add(sv.name, point)
	sv.f.t.Logf("killed %s at %s", sv.name, point)
}

// arm sets the kill targets of the running incarnation (the first) and the
// next ones; none disarms.
func (sv *supervisor) arm(targets []killTarget) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sv.targets = nil
	if len(targets) == 0 {
		sv.tap.arm(killTarget{})
		return
	}
	sv.tap.arm(targets[0])
	sv.targets = targets[1:]
}

func (f *chaosFarm) runController(ctx context.Context, nc *nats.Conn, _ *tap, ready func()) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := cascade.DefaultConfig()
	cfg.Registry, cfg.RegistryClient = f.reg.host, registry.NewClient(registry.WithInsecure(true))
	cfg.KeepPlans = 3 // prune (almost) every time a plan settles
	cfg.PruneEvery = time.Nanosecond
	var log *slog.Logger
	if os.Getenv("MESHBUILD_CHAOS_LOG") != "" {
		log = slog.New(slog.NewTextHandler(testLog{f.t, ctx}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c, err := cascade.New(cfg, js, f.cat, log, nil)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	// Once the controller serves its tools it has raised the catalogue
	// (setting the consumers' ack waits): shorten them again.
	for {
		select {
		case err := <-errc:
			return err
		case <-time.After(20 * time.Millisecond):
		}
		if cascadetest.Answers(ctx, f.nc, c.Module()) {
			break
		}
	}
	// Tried again while the bus is away (a round may take it just now),
	// as every process of the farm rides out an outage.
	for ctx.Err() == nil {
		err := f.shortenAckWaits(ctx)
		if err == nil {
			break
		}
		f.t.Logf("shortening the ack waits (trying again): %v", err)
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	ready()
	return <-errc
}

// testLog writes a controller's log to the test's (MESHBUILD_CHAOS_LOG=1),
// until its incarnation ends.
type testLog struct {
	t   *testing.T
	ctx context.Context
}

func (l testLog) Write(b []byte) (int, error) {
	if l.ctx.Err() == nil {
		l.t.Log(strings.TrimSpace(string(b)))
	}
	return len(b), nil
}

// shortenAckWaits sets the controller's and the holders' consumers' ack
// wait to chaosAckWait: a killed process's messages come back that soon.
func (f *chaosFarm) shortenAckWaits(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for _, c := range [][2]string{
		{mesh.EventsStream, mesh.ModuleConsumer("build-controller")},
		{mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform)},
	} {
		cons, err := f.js.Consumer(ctx, c[0], c[1])
		if err != nil {
			return fmt.Errorf("consumer %s/%s: %w", c[0], c[1], err)
		}
		cfg := cons.CachedInfo().Config
		cfg.AckWait = chaosAckWait
		if _, err := f.js.UpdateConsumer(ctx, c[0], cfg); err != nil {
			return fmt.Errorf("shortening the ack wait of %s/%s: %w", c[0], c[1], err)
		}
	}
	return nil
}

func (f *chaosFarm) runAgent(machine string) func(ctx context.Context, nc *nats.Conn, tp *tap, ready func()) error {
	return func(ctx context.Context, nc *nats.Conn, tp *tap, ready func()) error {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		cfg := agent.DefaultConfig()
		cfg.Machine = machine
		cfg.FetchWait = 200 * time.Millisecond
		cfg.Heartbeat = 100 * time.Millisecond
		cfg.Grace = 0
		cfg.RetryDelay = 50 * time.Millisecond
		// A killed agent's claim of its ask lapses as soon as the
		// shortened ack wait hands the ask to another (the same
		// redelivery, sooner, as the ack waits below).
		cfg.ClaimLease = chaosClaimLease
		a, err := agent.New(cfg, js, &chaosBuilder{f: f, machine: machine, tap: tp}, nil, nil)
		if err != nil {
			return err
		}
		ready()
		return a.Run(ctx)
	}
}

// --- the builder ----------------------------------------------------------

// chaosBuilds records every build the agents' builders did, by ask.
type chaosBuilds struct {
	mu    sync.Mutex
	calls map[string]int // ask id -> builds
	// orphans counts, by ask, the agents killed while holding it, and the
	// bus's outages long enough for its claim to lapse while it was held:
	// each may make one more build of it (the ask is redelivered).
	orphans map[string]int
	// holding is each machine's asks in hand: from its builder's start
	// until its claim is settled (an outcome announced, or handed back):
	// an agent starts its next build while it announces the last.
	holding map[string]map[string]bool
	// retried counts, by ask, the builds whose push found the registry
	// away: each is tried again.
	retried map[string]int
	total   int
}

// chaosBuilder is the agents' fake builder: it takes a moment, pushes a
// reproducible image labelled with its ask, and may be the place its
// agent is killed (before or after the push).
type chaosBuilder struct {
	f       *chaosFarm
	machine string
	tap     *tap
}

func (b *chaosBuilder) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	if b.tap.isDead() {
		// A dead incarnation's last fetched ask: never worked.
		return agent.Result{}, fmt.Errorf("%w: killed", agent.ErrInfra)
	}
	bs := b.f.builds
	bs.mu.Lock()
	bs.calls[a.ID]++
	bs.total++
	if bs.holding[b.machine] == nil {
		bs.holding[b.machine] = map[string]bool{}
	}
	bs.holding[b.machine][a.ID] = true
	bs.mu.Unlock()
	select {
	case <-time.After(time.Duration(5+rand.IntN(30)) * time.Millisecond):
	case <-ctx.Done():
		return agent.Result{}, context.Cause(ctx)
	}
	if b.tap.killPoint("build:before-push") {
		return agent.Result{}, fmt.Errorf("%w: killed", agent.ErrInfra)
	}
	img, ref, err := chaosImageRef(a)
	if err != nil {
		return agent.Result{}, err
	}
	if b.tap.isDead() {
		return agent.Result{}, fmt.Errorf("%w: killed", agent.ErrInfra)
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		if registry.IsInfra(err) {
			// The registry is away (the round took it down): the
			// ask is tried again, and may be built once more.
			bs.mu.Lock()
			bs.retried[a.ID]++
			bs.mu.Unlock()
			return agent.Result{}, fmt.Errorf("%w: pushing %s: %v", agent.ErrInfra, ref, err)
		}
		return agent.Result{}, fmt.Errorf("%w: pushing %s: %v", agent.ErrPush, ref, err)
	}
	if b.tap.killPoint("build:after-push") {
		return agent.Result{}, fmt.Errorf("%w: killed", agent.ErrInfra)
	}
	return agent.Result{Digest: ref.DigestStr(), Ref: ref.String()}, nil
}

// pushChaos pushes chaosImage(a) to a.Image's repository by digest, as an
// agent would: a push that fails is an agent.ErrPush.
func pushChaos(ctx context.Context, a mesh.Ask) (agent.Result, error) {
	img, ref, err := chaosImageRef(a)
	if err != nil {
		return agent.Result{}, err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return agent.Result{}, fmt.Errorf("%w: pushing %s: %v", agent.ErrPush, ref, err)
	}
	return agent.Result{Digest: ref.DigestStr(), Ref: ref.String()}, nil
}

// chaosImageRef is chaosImage(a) and its reference by digest in a.Image's
// repository (plain HTTP).
func chaosImageRef(a mesh.Ask) (v1.Image, name.Digest, error) {
	img, err := chaosImage(a)
	if err != nil {
		return nil, name.Digest{}, err
	}
	dg, err := img.Digest()
	if err != nil {
		return nil, name.Digest{}, err
	}
	ref, err := name.NewDigest(a.Image+"@"+dg.String(), name.Insecure)
	if err != nil {
		return nil, name.Digest{}, err
	}
	return img, ref, nil
}

// chaosImage is the image of an ask: a pure function of it (a rebuild
// pushes the same digest), its ask recorded in the config's labels so the
// registry's copy says what it was built for.
func chaosImage(a mesh.Ask) (v1.Image, error) {
	var content bytes.Buffer
	fmt.Fprintf(&content, "ask %s\n", a.ID)
	for _, b := range a.Bases {
		fmt.Fprintf(&content, "base %s %s\n", b.Module, b.Digest)
	}
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(content.Bytes(), types.OCILayer))
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Config.Labels = map[string]string{"meshbuild.plan": a.Plan, "meshbuild.module": a.Module, "meshbuild.ask": a.ID}
	return mutate.ConfigFile(img, cf)
}

// --- the registry -----------------------------------------------------------

// countingRegistry is the embedded registry (registry.New) behind a
// handler that counts the manifests pushed, by repository and digest.
type countingRegistry struct {
	host string
	// down: every request is answered 503, as a registry that is away.
	down   atomic.Bool
	mu     sync.Mutex
	puts   map[string]int               // repo@digest -> manifest PUTs answered 201
	labels map[string]map[string]string // repo@digest -> labels read back
}

func newCountingRegistry(t *testing.T) *countingRegistry {
	r := &countingRegistry{puts: map[string]int{}, labels: map[string]map[string]string{}}
	h := registry.New(t.TempDir())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.down.Load() {
			http.Error(w, "the test took the registry away", http.StatusServiceUnavailable)
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, req)
		repo, ref, ok := strings.Cut(strings.TrimPrefix(req.URL.Path, "/v2/"), "/manifests/")
		if req.Method == http.MethodPut && ok && sw.status == http.StatusCreated {
			r.mu.Lock()
			r.puts[repo+"@"+ref]++
			r.mu.Unlock()
		}
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }
func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// manifests returns, for repository repo, the manifests pushed to it and
// how many times each.
func (r *countingRegistry) manifests(repo string) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, n := range r.puts {
		if rp, dg, _ := strings.Cut(k, "@"); rp == repo {
			out[dg] = n
		}
	}
	return out
}

// labelsOf reads an image's labels back from the registry.
func (r *countingRegistry) labelsOf(repo, digest string) (map[string]string, error) {
	r.mu.Lock()
	l, ok := r.labels[repo+"@"+digest]
	r.mu.Unlock()
	if ok {
		return l, nil
	}
	ref, err := name.NewDigest(r.host+"/"+repo+"@"+digest, name.Insecure)
	if err != nil {
		return nil, err
	}
	img, err := remote.Image(ref)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.labels[repo+"@"+digest] = cf.Config.Labels
	r.mu.Unlock()
	return cf.Config.Labels, nil
}

// --- a round ----------------------------------------------------------------

// round pushes n plans (each rebuilds every module), the later ones while
// the earlier build, with the round's kills armed; waits for them to settle
// and checks the invariants.
func (f *chaosFarm) round(round, n int) {
	t := f.t
	victim := []string{"controller", "agents", "both"}[f.rng.IntN(3)]
	if victim != "agents" {
		f.ctrl.arm(f.drawTargets(controllerKinds, 1+f.rng.IntN(3)))
	} else {
		f.ctrl.arm(nil)
	}
	sure := f.rng.IntN(len(f.agents))
	for i, a := range f.agents {
		if victim != "controller" && (i == sure || f.rng.IntN(2) == 0) {
			a.arm(f.drawTargets(agentKinds, 1+f.rng.IntN(2)))
		} else {
			a.arm(nil)
		}
	}
	gaps := make([]int, n) // builds to wait for before each push
	for i := 1; i < n; i++ {
		gaps[i] = f.rng.IntN(5)
	}
	// In one round of three the registry goes away for a while, after a
	// few of the round's builds: pushes and the controller's checks of
	// built digests fail on infrastructure, and are tried again. In one
	// of four the bus does (the server stopped, and started again on its
	// store): every process rides it out.
	var outages []func()
	if f.faults.IntN(3) == 0 {
		outages = append(outages, f.outage(round, "the registry", func() { f.reg.down.Store(true) }, func() { f.reg.down.Store(false) }))
	}
	if f.faults.IntN(4) == 0 {
		// Away for longer than a claim outlives its last renewal (a
		// third of the lease before), the claims of the asks in hand
		// lapse, and another machine may build each again.
		var away time.Time
		outages = append(outages, f.outage(round, "the bus", func() { away = time.Now(); f.bus.Stop(0) }, func() {
			if time.Since(away) > chaosClaimLease/2 {
				f.builds.lapsed()
			}
			f.bus.Restart(0)
		}))
	}
	endOutages := func() {
		for _, end := range outages {
			end()
		}
	}
	var ids []string
	for i := range n {
		before := f.builds.count()
		testenv.WaitFor(t, chaosSettle, fmt.Sprintf("round %d: %d builds before push %d", round, gaps[i], i+1), func() bool {
			return f.builds.count() >= before+gaps[i] || f.allSettled(ids)
		})
		// Each push on a branch of its own: every plan builds all of
		// its modules (a newer push to the same branch would supersede
		// what an older plan has not started: tested in schedule_test).
		id, _, err := cascade.Push(context.Background(), f.js, mesh.Pushed{
			Repo: meshtest.FleetRepo, Ref: fmt.Sprintf("refs/heads/r%d-p%d", round, i+1), Commit: fmt.Sprintf("r%d-p%d", round, i+1),
		})
		if err != nil {
			t.Fatalf("round %d: push: %v", round, err)
		}
		ids = append(ids, id)
	}
	f.waitSettled(fmt.Sprintf("round %d (%s killed)", round, victim), ids)
	endOutages()
	// Stop killing, and let every event and ask be settled on the bus.
	f.ctrl.arm(nil)
	for _, a := range f.agents {
		a.arm(nil)
	}
	testenv.WaitFor(t, chaosSettle, fmt.Sprintf("round %d: the controller's events and the queue drained", round), f.drained)
	f.check(round, ids)
}

// outage takes something away (down) after a few of the round's builds,
// for a while, and brings it back (up); the func it returns ends it early
// if it is still on (or not begun) and waits until it is over.
func (f *chaosFarm) outage(round int, what string, down, up func()) (end func()) {
	after, away := f.faults.IntN(8), time.Duration(200+f.faults.IntN(1500))*time.Millisecond
	before := f.builds.count()
	stop, over := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(over)
		for f.builds.count() < before+after {
			select {
			case <-stop:
				return // the round ended first
			case <-time.After(5 * time.Millisecond):
			}
		}
		down()
		defer up()
		select {
		case <-stop:
		case <-time.After(away):
		}
	}()
	f.t.Logf("round %d: %s goes away for %s after %d builds", round, what, away, after)
	return func() { close(stop); <-over }
}

// waitSettled waits for the plans to settle; after chaosSettle it fails,
// saying where each plan is.
func (f *chaosFarm) waitSettled(what string, ids []string) {
	f.t.Helper()
	deadline := time.Now().Add(chaosSettle)
	for !f.allSettled(ids) {
		if time.Now().After(deadline) {
			var where []string
			for _, id := range ids {
				r, err := f.store.Plan(context.Background(), id)
				where = append(where, fmt.Sprintf("%s: %s %+v %v", id, r.Outcome, r.Counts, err))
			}
			f.t.Fatalf("%s: the plans did not settle in %s: %s", what, chaosSettle, strings.Join(where, "; "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *chaosFarm) allSettled(ids []string) bool {
	if len(ids) == 0 {
		return false
	}
	for _, id := range ids {
		r, err := f.store.Plan(context.Background(), id)
		if err != nil || r.Outcome == cascade.OutcomeRunning {
			return false
		}
	}
	return true
}

// drained: no event waiting for the controller or unacknowledged by it, no
// ask in the build queue or in a holder's hands.
func (f *chaosFarm) drained() bool {
	ctx := context.Background()
	cons, err := f.js.Consumer(ctx, mesh.EventsStream, mesh.ModuleConsumer("build-controller"))
	if err != nil {
		return false
	}
	ci := cons.CachedInfo()
	if ci.NumPending != 0 || ci.NumAckPending != 0 {
		return false
	}
	seat, err := f.js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		return false
	}
	si := seat.CachedInfo()
	return si.NumPending == 0 && si.NumAckPending == 0
}

// check verifies the invariants for a round's plans, newest last.
func (f *chaosFarm) check(round int, ids []string) {
	t := f.t
	ctx := context.Background()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("round %d: "+format, append([]any{round}, args...)...)
	}
	built := f.builtEvents(ids)
	for _, id := range ids {
		rec, err := f.store.Plan(ctx, id)
		if err != nil {
			fail("plan %s: %v", id, err)
			continue
		}
		if rec.Outcome != cascade.OutcomeBuilt || rec.Counts.Built != len(chaosGraph) {
			fail("plan %s settled %s %+v, want built with %d modules", id, rec.Outcome, rec.Counts, len(chaosGraph))
		}
		mods, err := f.store.Modules(ctx, id)
		if err != nil {
			fail("modules of %s: %v", id, err)
		}
		for m := range chaosGraph {
			// The events' record: one built per (plan, module), for the
			// module's one ask (its first: nothing was asked twice).
			evs := built[id+"/"+m]
			if len(evs) != 1 {
				fail("plan %s module %s: %d built events in %s, want exactly 1: %+v", id, m, len(evs), mesh.EventsStream, evs)
				continue
			}
			ev := evs[0]
			if want := cascade.AskID(id, m, 1); ev.Ask != want {
				fail("plan %s module %s built by ask %s, want %s (asked once)", id, m, ev.Ask, want)
			}
			// Nothing acknowledged lost: the stored state has the built.
			if ms := mods[m]; ms.State != cascade.Built || ms.Digest != ev.Digest || ms.Ask != ev.Ask {
				fail("plan %s module %s stored as %s %s (ask %s), but %s says built %s (ask %s)", id, m, ms.State, ms.Digest, ms.Ask, mesh.EventsStream, ev.Digest, ev.Ask)
			}
			// The registry's record: one image for (plan, module), the
			// announced one, pushed once unless a holder of its ask was
			// killed (then the same reproducible image again).
			var digests []string
			pushes := 0
			for dg, n := range f.reg.manifests(m) {
				l, err := f.reg.labelsOf(m, dg)
				if err != nil {
					fail("reading %s@%s back: %v", m, dg, err)
					continue
				}
				if l["meshbuild.plan"] == id {
					digests = append(digests, dg)
					pushes += n
				}
			}
			if len(digests) != 1 || digests[0] != ev.Digest {
				fail("plan %s module %s: the registry holds %v, want exactly the announced %s", id, m, digests, ev.Digest)
			}
			calls, orphans := f.builds.of(ev.Ask)
			if calls > 1+orphans || pushes > calls {
				fail("plan %s module %s: %d builds and %d pushes, with %d holders killed holding it or pushes refused by the registry away (want at most 1 + those)", id, m, calls, pushes, orphans)
			}
		}
	}
	// current.<module> is the newest plan's image.
	last := ids[len(ids)-1]
	cur, err := f.store.Currents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for m := range chaosGraph {
		evs := built[last+"/"+m]
		if len(evs) != 1 {
			continue // reported above
		}
		if c := cur[m]; c.Plan != last || c.Digest != evs[0].Digest {
			var seqs []string
			for _, id := range ids {
				r, _ := f.store.Plan(ctx, id)
				seqs = append(seqs, fmt.Sprintf("%s seq %d created %s", id, r.Seq, r.Created.Format(time.StampMicro)))
			}
			fail("current.%s is plan %s (seq %d) %s, want the newest plan %s %s; the round's plans, in push order: %s",
				m, c.Plan, c.Seq, c.Digest, last, evs[0].Digest, strings.Join(seqs, "; "))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// builtEvents reads the built events in EVENTS since the last call, and
// returns every one seen so far of the given plans, by plan/module.
func (f *chaosFarm) builtEvents(ids []string) map[string][]mesh.Built {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := f.js.OrderedConsumer(ctx, mesh.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventBuilt)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: f.builtSeq + 1,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) {
				break // none left
			}
			f.t.Fatalf("reading built events: %v", err)
		}
		var ev mesh.Built
		if err := json.Unmarshal(msg.Data(), &ev); err != nil {
			f.t.Fatalf("a built event: %v", err)
		}
		f.built[ev.Plan+"/"+ev.Module] = append(f.built[ev.Plan+"/"+ev.Module], ev)
		md, err := msg.Metadata()
		if err != nil {
			f.t.Fatal(err)
		}
		f.builtSeq = md.Sequence.Stream
		if md.NumPending == 0 {
			break
		}
	}
	out := map[string][]mesh.Built{}
	for _, id := range ids {
		for m := range chaosGraph {
			if evs, ok := f.built[id+"/"+m]; ok {
				out[id+"/"+m] = evs
			}
		}
	}
	return out
}

func (bs *chaosBuilds) count() int {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.total
}

func (bs *chaosBuilds) of(ask string) (calls, orphans int) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.calls[ask], bs.orphans[ask] + bs.retried[ask]
}

// released: the machine settled its claim of ask (the write went out
// whole): a redelivery of it is not built again.
func (bs *chaosBuilds) released(machine, ask string) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	delete(bs.holding[machine], ask)
}

// killed: the machine died; the asks in its hands may be built again.
func (bs *chaosBuilds) killed(machine string) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for a := range bs.holding[machine] {
		bs.orphans[a]++
	}
	delete(bs.holding, machine)
}

// lapsed: the bus was away long enough for the claims of the asks in
// hand to lapse (no renewal can reach it): another machine may be given
// each of them and build it while its holder does.
func (bs *chaosBuilds) lapsed() {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, asks := range bs.holding {
		for a := range asks {
			bs.orphans[a]++
		}
	}
}

// --- kill targets -------------------------------------------------------------

// Kinds of message a tap can kill at, each with the most of them a target
// counts to (the n-th is drawn in 1..max).
var (
	controllerKinds = []kindMax{
		{kindKVPut, 40},   // persist: between taking events and storing, mid-persist
		{kindKVCreate, 3}, // a plan's record created
		{kindAsk, 12},     // between storing and publishing asks, mid-publish
		{kindAck, 15},     // between storing (and publishing) and acking events, mid-ack
		{kindKVPurge, 8},  // mid-prune
		{kindAPI, 30},     // reads, consumer info (idle holders), pull requests
	}
	agentKinds = []kindMax{
		{kindStarted, 3},
		{kindBuilt, 3},
		{kindAck, 3},
		{kindBeforePush, 3},
		{kindAfterPush, 3},
	}
)

const (
	kindKVPut      = "kv-put"
	kindKVCreate   = "kv-create"
	kindKVPurge    = "kv-purge"
	kindAsk        = "ask"
	kindAck        = "ack"
	kindAPI        = "api"
	kindStarted    = "started"
	kindBuilt      = "built"
	kindInProgress = "in-progress"
	kindOther      = "other"
	kindBeforePush = "build:before-push"
	kindAfterPush  = "build:after-push"
)

type kindMax struct {
	kind string
	max  int
}

// killTarget: die at the n-th message of kind, just before writing it or
// just after.
type killTarget struct {
	kind  string
	n     int
	after bool
}

func (k killTarget) String() string {
	if strings.HasPrefix(k.kind, "build:") {
		return k.kind
	}
	if k.after {
		return "after " + k.kind
	}
	return "before " + k.kind
}

func (f *chaosFarm) drawTargets(kinds []kindMax, n int) []killTarget {
	out := make([]killTarget, n)
	for i := range out {
		k := kinds[f.rng.IntN(len(kinds))]
		out[i] = killTarget{kind: k.kind, n: 1 + f.rng.IntN(k.max), after: f.rng.IntN(2) == 0}
	}
	return out
}

type killCounts struct {
	mu sync.Mutex
	n  map[string]int // who/point -> kills
}

func (k *killCounts) add(who, point string) {
	if strings.HasPrefix(who, "m") {
		who = "agent"
	}
	k.mu.Lock()
	k.n[who+": "+point]++
	k.mu.Unlock()
}

func (k *killCounts) total() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, v := range k.n {
		n += v
	}
	return n
}

func (k *killCounts) summary() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	keys := slices.Sorted(func(yield func(string) bool) {
		for key := range k.n {
			if !yield(key) {
				return
			}
		}
	})
	total := 0
	var parts []string
	for _, key := range keys {
		total += k.n[key]
		parts = append(parts, fmt.Sprintf("%s ×%d", key, k.n[key]))
	}
	return fmt.Sprintf("%d kills: %s", total, strings.Join(parts, ", "))
}

// --- the tap --------------------------------------------------------------------

var errKilled = errors.New("killed by the test")

// tap is a process's connection to the NATS server, as a dialer and a
// net.Conn: it reads the client protocol written through it, counts each
// message by kind, and at its target cuts the connection between two
// messages, as a process killed at that instant would.
type tap struct {
	who string
	// onKill is called once, when the tap kills; onSettled after a
	// write settling the machine's claim of an ask (an outcome announced,
	// or handed back) went out whole.
	onKill    func()
	onSettled func(ask string)

	mu     sync.Mutex
	conn   net.Conn
	p      protoParser
	target killTarget
	counts map[string]int
	dead   bool
	point  string
}

// Dial implements nats.CustomDialer.
func (t *tap) Dial(network, address string) (net.Conn, error) {
	if t.isDead() {
		return nil, errKilled
	}
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.conn = c
	t.mu.Unlock()
	return tapConn{Conn: c, t: t}, nil
}

type tapConn struct {
	net.Conn
	t *tap
}

func (c tapConn) Write(b []byte) (int, error) { return c.t.write(c.Conn, b) }

func (t *tap) arm(k killTarget) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.target = k
	clear(t.counts)
}

func (t *tap) write(c net.Conn, b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead {
		return 0, errKilled
	}
	cut := -1
	var settled []string
	t.p.feed(b, func(kind string, start, end int) bool {
		t.counts[kind]++
		if t.target.kind == kind && t.counts[kind] == t.target.n {
			cut = end
			if !t.target.after {
				cut = max(0, start)
				return false
			}
		}
		if t.p.settled != "" {
			settled = append(settled, t.p.settled)
		}
		return cut < 0
	})
	wrote := b
	if cut >= 0 {
		wrote = b[:cut]
	}
	n, err := c.Write(wrote)
	if err == nil && t.onSettled != nil {
		for _, ask := range settled {
			t.onSettled(ask)
		}
	}
	if cut < 0 {
		return n, err
	}
	t.dieLocked(t.target.String())
	return n, errKilled
}

func (t *tap) dieLocked(point string) {
	t.dead, t.point = true, point
	if t.conn != nil {
		_ = t.conn.Close()
	}
	t.onKill()
}

// killPoint kills the process here if kind is its target (the builder's
// own points count like messages).
func (t *tap) killPoint(kind string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead {
		return true
	}
	t.counts[kind]++
	if t.target.kind == kind && t.counts[kind] == t.target.n {
		t.dieLocked(kind)
		return true
	}
	return false
}

func (t *tap) isDead() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dead
}

func (t *tap) killedAt() (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.point, t.dead
}

// protoParser splits the client protocol into messages, across writes.
type protoParser struct {
	line    []byte // the op line so far
	need    int    // payload bytes (with CRLF) still to come
	payload []byte
	subject string
	start   int // where the current op began in the current write; -1: in an earlier one
	// settled is the ask whose claim the op just parsed settles
	// (settledAsk); empty for none.
	settled string
}

// feed parses b, calling fn at the end of each op with its kind and its
// bounds in b (start < 0: it began in an earlier write); fn returning
// false stops.
func (p *protoParser) feed(b []byte, fn func(kind string, start, end int) bool) {
	p.start = -1 // an op carried over from an earlier write
	i := 0
	for i < len(b) {
		if p.need > 0 {
			k := min(p.need, len(b)-i)
			p.payload = append(p.payload, b[i:i+k]...)
			p.need -= k
			i += k
			if p.need == 0 {
				kind := classify(p.subject, p.payload)
				p.settled = settledAsk(p.subject, p.payload)
				p.payload = p.payload[:0]
				if !fn(kind, p.start, i) {
					return
				}
			}
			continue
		}
		if len(p.line) == 0 {
			p.start = i
		}
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			p.line = append(p.line, b[i:]...)
			return
		}
		p.line = append(p.line, b[i:i+j+1]...)
		i += j + 1
		f := strings.Fields(string(p.line))
		p.line = p.line[:0]
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "PUB", "HPUB":
			n, err := strconv.Atoi(f[len(f)-1])
			if err != nil || len(f) < 3 {
				continue
			}
			p.subject, p.need = f[1], n+2
		default:
			p.settled = ""
			if !fn(kindOther, p.start, i) {
				return
			}
		}
	}
}

// settledAsk is the ask whose claim a message settles: a write of a
// machine's key in the ask claims bucket recording an outcome or a hand
// back (claim.AskRecord's Outcome, Released); empty for any other.
func settledAsk(subject string, payload []byte) string {
	key, ok := strings.CutPrefix(subject, mesh.KVKeySubject(mesh.AskClaimsBucket(mesh.BuildSeat), ""))
	if !ok || !(bytes.Contains(payload, []byte(`"outcome":"`)) || bytes.Contains(payload, []byte(`"released":"`))) {
		return ""
	}
	if i := strings.LastIndexByte(key, '.'); i > 0 { // mesh.AskClaimKey: <ask>.<machine>
		return key[:i]
	}
	return ""
}

// classify names a message by its subject (and, for the KV, its headers).
func classify(subject string, payload []byte) string {
	switch {
	case strings.HasPrefix(subject, "$KV."):
		switch {
		case bytes.Contains(payload, []byte("KV-Operation: PURGE")):
			return kindKVPurge
		case bytes.Contains(payload, []byte("Nats-Expected-Last-Subject-Sequence")):
			return kindKVCreate
		}
		return kindKVPut
	case strings.HasPrefix(subject, "$JS.ACK."):
		if bytes.HasPrefix(payload, []byte("+WPI")) {
			return kindInProgress
		}
		return kindAck
	case strings.HasPrefix(subject, "$JS.API."):
		return kindAPI
	case strings.HasPrefix(subject, mesh.SeatAcceptSubject(mesh.BuildSeat, mesh.BuildVerb)+"."):
		return kindAsk
	}
	switch _, _, event, _ := mesh.SplitHolderEventSubject(subject); event {
	case mesh.EventStarted:
		return kindStarted
	case mesh.EventBuilt:
		return kindBuilt
	}
	return kindOther
}
