package cascade

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/registry"
)

// Config configures a controller. DefaultConfig fills the defaults.
type Config struct {
	// Registry is where images go: "HOST:PORT" or "HOST:PORT/PREFIX". A
	// module m's image is Registry/m.
	Registry string
	// RegistryInsecure talks plain http to the registry.
	RegistryInsecure bool
	// Replicas of every stream and bucket the controller raises.
	Replicas int
	// Batch is how many events are worked between two writes of the state.
	Batch int
	// Module is the catalogue module the controller runs as; empty means
	// the one that holds mesh-controller.
	Module string
	// Window is the most asks of a plan queued at once (State.Window):
	// released asks beyond it are held and published best first, by
	// remaining critical path, as holders start asks. Asks are ranked by
	// each module's last build duration seen by this controller. 0
	// publishes every released ask at once. WindowIdle holds released asks
	// and publishes, best first, as many as holders are idle (pull
	// requests waiting on the seat's consumer): the order of a window of 1
	// with the throughput of none.
	Window int
	// KeepPlans is how many settled plans the store keeps; older ones are
	// pruned so the bucket never fills. 0 is DefaultKeepPlans.
	KeepPlans int
}

// DefaultConfig returns a Config with defaults.
func DefaultConfig() Config {
	return Config{Replicas: 1, Batch: 512, KeepPlans: DefaultKeepPlans, Window: WindowIdle}
}

// ErrConfig is wrapped by every refusal of a Config.
var ErrConfig = errors.New("invalid controller config")

// Observer is told what the controller does, for metrics.
type Observer interface {
	PlanSettled(outcome string, d time.Duration)
	Plans(byOutcome map[string]int, blocked int)
}

type nopObserver struct{}

func (nopObserver) PlanSettled(string, time.Duration) {}
func (nopObserver) Plans(map[string]int, int)         {}

// Controller turns triggers into plans and built/failed into the next asks.
// One goroutine owns all plan state; tool requests reach it by channel.
type Controller struct {
	cfg    Config
	js     jetstream.JetStream
	nc     *nats.Conn
	log    *slog.Logger
	obs    Observer
	module string

	cat   *mesh.Catalogue
	ix    *planner.Index
	store *Store

	plans   map[string]*State
	current map[string]Current
	seq     uint64
	askSeq  map[string]uint64
	cmds    chan command

	lastPrune time.Time
	// held is set when asks are held for idle holders (WindowIdle).
	held         bool
	seatConsumer jetstream.Consumer
	// lastBuild is each module's last build duration, the estimate that
	// ranks a new plan's asks.
	lastBuild map[string]time.Duration

	// a batch's pending effects
	dirty    map[string]any
	dirtyRun map[string]bool
	submits  []Submit
}

// New returns a controller for a checked catalogue.
func New(cfg Config, js jetstream.JetStream, cat *mesh.Catalogue, log *slog.Logger, obs Observer) (*Controller, error) {
	if cfg.Registry == "" {
		return nil, fmt.Errorf("%w: no registry: set --registry HOST:PORT", ErrConfig)
	}
	if cfg.Batch < 1 {
		cfg.Batch = 512
	}
	if cfg.Window < WindowIdle {
		return nil, fmt.Errorf("%w: window %d: want %d (as many as holders are idle), 0 (every released ask at once) or more", ErrConfig, cfg.Window, WindowIdle)
	}
	if cfg.Replicas < 1 {
		cfg.Replicas = 1
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if obs == nil {
		obs = nopObserver{}
	}
	module, err := controllerModule(cat, cfg.Module)
	if err != nil {
		return nil, err
	}
	return &Controller{
		cfg: cfg, js: js, nc: js.Conn(), log: log, obs: obs, module: module,
		cat: cat, ix: planner.NewIndex(cat),
		plans: map[string]*State{}, current: map[string]Current{}, askSeq: map[string]uint64{},
		cmds: make(chan command, 64), lastBuild: map[string]time.Duration{},
	}, nil
}

// controllerModule finds the catalogue module the controller runs as.
func controllerModule(cat *mesh.Catalogue, name string) (string, error) {
	for _, m := range cat.Holders("mesh-controller") {
		if name != "" && m.Module != name {
			continue
		}
		for _, b := range m.State {
			if b.Name == StateBucket {
				return m.Module, nil
			}
		}
	}
	return "", fmt.Errorf("%w: no module holds mesh-controller with state %q: add `holds: [mesh-controller]` and `state: [{name: %s}]` to the controller's manifest",
		ErrConfig, StateBucket, StateBucket)
}

// Module is the catalogue module the controller runs as.
func (c *Controller) Module() string { return c.module }

// Image is module m's image repository.
func (c *Controller) Image(module string) string { return c.cfg.Registry + "/" + module }

// Run raises the catalogue, resumes the plans in the store and works until
// ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	r, err := mesh.Raise(ctx, c.js, c.cat, c.cfg.Replicas)
	if err != nil {
		return err
	}
	c.logRaise(r)
	if c.store, err = OpenStore(ctx, c.js, c.module); err != nil {
		return err
	}
	if err := c.resume(ctx); err != nil {
		return err
	}
	subs, err := c.serveTools()
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	cons, err := c.js.Consumer(ctx, mesh.EventsStream, mesh.ModuleConsumer(c.module))
	if err != nil {
		return fmt.Errorf("binding the controller's consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(c.cfg.Batch))
	if err != nil {
		return fmt.Errorf("consuming events: %w", err)
	}
	events := make(chan jetstream.Msg, c.cfg.Batch)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(events)
		for {
			m, err := it.Next()
			if err != nil {
				if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					c.log.Warn("event consumer stopped", "err", err)
				}
				return
			}
			events <- m
		}
	})
	// On the way out, events fetched and not worked go back at once, so
	// the next holder of mesh-controller has them without an ack wait (a
	// drain needs the bus: cut off from it, just stop).
	defer func() {
		if c.nc.IsConnected() {
			it.Drain()
		} else {
			it.Stop()
		}
		for m := range events {
			_ = m.Nak()
		}
		wg.Wait()
	}()
	c.log.Info("controller running", "module", c.module, "plans", len(c.plans))

	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		var batch []jetstream.Msg
		var look <-chan time.Time
		if c.held {
			look = time.After(20 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-look:
		case m, ok := <-events:
			if !ok {
				return errors.New("the event consumer stopped")
			}
			batch = append(batch, m)
		drain:
			for len(batch) < c.cfg.Batch {
				select {
				case m, ok := <-events:
					if !ok {
						break drain
					}
					batch = append(batch, m)
				default:
					break drain
				}
			}
			for _, m := range batch {
				c.event(ctx, m)
			}
		case cmd := <-c.cmds:
			cmd.reply <- c.command(ctx, cmd)
		case <-tick.C:
			c.observe()
			continue
		}
		if err := c.flush(ctx); err != nil {
			return err
		}
		if ctx.Err() != nil {
			// Stopped (or lost mesh-controller) mid-batch: its state may be
			// unwritten, so its events stay unacked for the next holder.
			return nil
		}
		for _, m := range batch {
			_ = m.Ack()
		}
	}
}

func (c *Controller) logRaise(r mesh.RaiseReport) {
	c.log.Info("raised the catalogue", "created", len(r.Created), "updated", len(r.Updated), "unchanged", len(r.Unchanged))
	for _, o := range r.Orphans {
		c.log.Warn("declaration gone; kept, not deleted", "what", o)
	}
}

// SetCatalogue swaps in a changed catalogue: raised first, then used for
// plans made from now on.
func (c *Controller) SetCatalogue(ctx context.Context, cat *mesh.Catalogue) error {
	r, err := mesh.Raise(ctx, c.js, cat, c.cfg.Replicas)
	if err != nil {
		return err
	}
	c.logRaise(r)
	res := c.do(ctx, command{kind: "catalogue", cat: cat})
	if res.Error != "" {
		return errors.New(res.Error)
	}
	return nil
}

// resume loads every running plan, re-submits what was queued and releases
// what a built recorded before the stop had made ready: level-triggered.
func (c *Controller) resume(ctx context.Context) error {
	recs, err := c.store.Plans(ctx)
	if err != nil {
		return err
	}
	if c.current, err = c.store.Currents(ctx); err != nil {
		return err
	}
	est, err := c.store.Estimates(ctx)
	if err != nil {
		return err
	}
	for m, d := range est {
		if _, ok := c.lastBuild[m]; !ok {
			c.lastBuild[m] = d
		}
	}
	for _, r := range recs {
		c.seq = max(c.seq, r.Seq)
		if r.Outcome != OutcomeRunning {
			continue
		}
		p, err := c.ix.Plan(r.Trigger)
		if err != nil {
			c.log.Error("cannot plan a stored plan again; leaving it", "plan", r.ID, "err", err)
			continue
		}
		mods, err := c.store.Modules(ctx, r.ID)
		if err != nil {
			return err
		}
		st, err := Load(p, r, mods)
		if err != nil {
			c.log.Error("cannot load a stored plan; leaving it", "plan", r.ID, "err", err)
			continue
		}
		st.Window = c.planWindow()
		c.plans[r.ID] = st
		c.enqueue(st, st.Pending())
		c.enqueue(st, st.Start(time.Now().UTC()))
		c.log.Info("resumed a plan", "plan", r.ID, "counts", fmt.Sprintf("%+v", st.Counts()))
	}
	return c.flush(ctx)
}

// event works one event of the controller's consumer.
func (c *Controller) event(ctx context.Context, m jetstream.Msg) {
	now := time.Now().UTC()
	decode := func(v any) bool {
		if err := json.Unmarshal(m.Data(), v); err != nil {
			c.log.Warn("refusing a malformed event", "subject", m.Subject(), "err", err)
			_ = m.Term()
			return false
		}
		return true
	}
	switch m.Subject() {
	case mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed):
		var ev mesh.Pushed
		if !decode(&ev) {
			return
		}
		t := planner.Trigger{Kind: planner.KindPush, Repo: ev.Repo, Commit: ev.Commit, Ref: ev.Ref, Paths: ev.Paths}
		if _, _, err := c.createPlan(ctx, t, now); err != nil {
			c.log.Warn("no plan for a push", "repo", ev.Repo, "commit", ev.Commit, "err", err)
		}
	case mesh.SeatEventSubject(mesh.BuildSeat, mesh.EventStarted):
		var ev mesh.Started
		if !decode(&ev) {
			return
		}
		if st := c.plans[ev.Plan]; st != nil && st.Started(ev) {
			c.touch(st, ev.Module)
		}
	case mesh.SeatEventSubject(mesh.BuildSeat, mesh.EventBuilt):
		var ev mesh.Built
		if !decode(&ev) {
			return
		}
		st := c.plans[ev.Plan]
		if st == nil {
			return
		}
		if _, ok := st.Module(ev.Module); !ok {
			return
		}
		next := st.Built(ev, now)
		c.touch(st, ev.Module)
		if ev.Duration > 0 {
			c.lastBuild[ev.Module] = ev.Duration
			c.dirty[EstimateKey(ev.Module)] = ev.Duration
		}
		if cur, ok := st.Current(ev.Module); ok && cur.Digest == ev.Digest && Newer(cur, c.current[ev.Module]) {
			c.current[ev.Module] = cur
			c.dirty[CurrentKey(ev.Module)] = cur
		}
		c.enqueue(st, next)
	case mesh.SeatEventSubject(mesh.BuildSeat, mesh.EventFailed):
		var ev mesh.Failed
		if !decode(&ev) {
			return
		}
		if st := c.plans[ev.Plan]; st != nil {
			blocked := st.Failed(ev, now)
			c.touch(st, ev.Module)
			c.touch(st, blocked...)
		}
	}
}

// createPlan plans a trigger and starts it; a plan that exists already is
// not made again (created false).
func (c *Controller) createPlan(ctx context.Context, t planner.Trigger, now time.Time) (PlanRecord, bool, error) {
	p, err := c.ix.Plan(t)
	if err != nil {
		return PlanRecord{}, false, err
	}
	if st, ok := c.plans[p.ID]; ok {
		return Record(st), false, nil
	}
	st := NewState(p, now)
	st.Seq = c.seq + 1
	st.Window = c.planWindow()
	if len(c.lastBuild) > 0 {
		st.SetEstimates(c.lastBuild)
	}
	rec := Record(st)
	if p.Empty() {
		rec.Outcome, rec.Finished = OutcomeEmpty, now
		rec.Message = "nothing to build: " + emptyReason(t)
	}
	created, err := c.store.CreatePlan(ctx, rec)
	if err != nil {
		return rec, false, err
	}
	if !created {
		old, err := c.store.Plan(ctx, p.ID)
		return old, false, err
	}
	c.seq++
	c.log.Info("plan", "plan", p.ID, "trigger", st.Summary, "modules", len(p.Modules), "tiers", len(p.Tiers))
	if p.Empty() {
		return rec, true, nil
	}
	c.plans[p.ID] = st
	c.enqueue(st, st.Start(now))
	for _, m := range st.Modules {
		c.touch(st, m.Module)
	}
	return rec, true, nil
}

func emptyReason(t planner.Trigger) string {
	if t.Kind == planner.KindPush {
		if len(t.Paths) > 0 {
			return fmt.Sprintf("no module is built from %s under the changed paths", t.Repo)
		}
		return fmt.Sprintf("no module in the catalogue is built from %s", t.Repo)
	}
	return "no module selected"
}

func (c *Controller) touch(st *State, modules ...string) {
	if c.dirty == nil {
		c.dirty, c.dirtyRun = map[string]any{}, map[string]bool{}
	}
	c.dirtyRun[st.Plan] = true
	for _, m := range modules {
		if ms, ok := st.Module(m); ok {
			c.dirty[ModuleKey(st.Plan, m)] = ms
		}
	}
}

// enqueue turns submits into asks for the next flush. A submit whose base
// has no image fails at once, blocking what is built on it.
func (c *Controller) enqueue(st *State, subs []Submit) {
	for _, s := range subs {
		c.touch(st, s.Module)
		c.submits = append(c.submits, s)
	}
}

// ask composes the ask of a submit: every base pinned to a digest.
func (c *Controller) ask(ctx context.Context, s Submit) (mesh.Ask, error) {
	a := mesh.Ask{
		Version: mesh.AskVersion, ID: s.AskID, Plan: s.Plan, Module: s.Module,
		Source: mesh.Source{Repo: s.Source.Repo, Commit: s.Source.Commit, Path: s.Source.Path, Dockerfile: s.Source.Dockerfile},
		Image:  c.Image(s.Module), Cache: c.Image(s.Module) + ":buildcache",
	}
	if a.Source.Commit == "" {
		a.Source.Commit = "HEAD"
	}
	if len(s.Source.Platforms) > 0 {
		a.Platform = s.Source.Platforms[0]
	}
	for _, b := range slices.Sorted(maps.Keys(s.Bases)) {
		a.Bases = append(a.Bases, mesh.Base{Module: b, Image: c.Image(b), Digest: s.Bases[b]})
	}
	for _, b := range s.External {
		dg, err := c.currentDigest(ctx, b)
		if err != nil {
			return a, err
		}
		a.Bases = append(a.Bases, mesh.Base{Module: b, Image: c.Image(b), Digest: dg})
	}
	return a, nil
}

// currentDigest is a base's current digest: the newest plan's result, or
// else what the registry's latest tag resolves to now.
func (c *Controller) currentDigest(ctx context.Context, module string) (string, error) {
	if cur, ok := c.current[module]; ok && cur.Digest != "" {
		return cur.Digest, nil
	}
	ref := c.Image(module) + ":latest"
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dg, err := registry.Resolve(rctx, ref, c.cfg.RegistryInsecure)
	if err != nil {
		return "", fmt.Errorf("base %s has no image (%s: %v): build it first with `builds rebuild %s`", module, ref, err, module)
	}
	return dg, nil
}

// flush writes what changed and publishes the asks, retrying until both
// are done: events are acknowledged only after it.
func (c *Controller) flush(ctx context.Context) error {
	// With a window, a plan whose state changed (a started, above all)
	// publishes the best held asks its window now has room for.
	for id := range c.dirtyRun {
		if st := c.plans[id]; st != nil && c.cfg.Window > 0 {
			st.Window = c.cfg.Window
			c.enqueue(st, st.Fill(time.Now().UTC()))
		}
	}
	if c.cfg.Window == WindowIdle {
		c.held = c.fillIdle(ctx)
	}
	delay := 100 * time.Millisecond
	for {
		err := c.flushOnce(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		c.log.Warn("writing plan state failed; retrying", "err", err, "delay", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

func (c *Controller) flushOnce(ctx context.Context) error {
	now := time.Now().UTC()
	// Asks first become failures when a base has no image.
	var asks []mesh.Ask
	for _, s := range c.submits {
		st := c.plans[s.Plan]
		a, err := c.ask(ctx, s)
		if err != nil {
			if st != nil {
				blocked := st.Failed(mesh.Failed{Version: mesh.AskVersion, Ask: s.AskID, Plan: s.Plan, Module: s.Module,
					Reason: mesh.ReasonSource, Message: err.Error(), At: now}, now)
				c.touch(st, s.Module)
				c.touch(st, blocked...)
			}
			continue
		}
		asks = append(asks, a)
	}
	for id := range c.dirtyRun {
		if st := c.plans[id]; st != nil {
			c.dirty[PlanKey(id)] = Record(st)
		}
	}
	if len(c.dirty) > 0 {
		if err := c.store.Put(ctx, c.dirty); err != nil {
			return err
		}
	}
	// Publish asks only once the state that says they are queued is
	// stored: a restart re-submits every queued ask, deduplicated by id.
	futures := make([]jetstream.PubAckFuture, 0, len(asks))
	subj := mesh.SeatAcceptSubject(mesh.BuildSeat, mesh.BuildVerb)
	for _, a := range asks {
		data, _ := json.Marshal(a)
		f, err := c.js.PublishAsync(subj, data, jetstream.WithMsgID(a.ID))
		if err != nil {
			return fmt.Errorf("submitting %s: %w", a.ID, err)
		}
		futures = append(futures, f)
	}
	if len(futures) > 0 {
		select {
		case <-c.js.PublishAsyncComplete():
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Second):
			return errors.New("submitting asks: no acknowledgement in 30s")
		}
		for i, f := range futures {
			select {
			case ack := <-f.Ok():
				c.askSeq[asks[i].ID] = ack.Sequence
			case err := <-f.Err():
				return fmt.Errorf("submitting %s: %w", asks[i].ID, err)
			}
		}
	}
	for id := range c.dirtyRun {
		st := c.plans[id]
		if st != nil && st.Settled() {
			rec := Record(st)
			c.obs.PlanSettled(string(rec.Outcome), rec.Updated.Sub(rec.Created))
			c.log.Info("plan settled", "plan", id, "outcome", rec.Outcome, "counts", fmt.Sprintf("%+v", rec.Counts))
			if rec.Outcome == OutcomeBuilt || rec.Outcome == OutcomeCancelled {
				delete(c.plans, id) // failed plans stay for a retry
			}
		}
	}
	settled := false
	for id := range c.dirtyRun {
		if st := c.plans[id]; st == nil || st.Settled() {
			settled = true
		}
	}
	c.dirty, c.dirtyRun, c.submits = nil, nil, nil
	if settled && time.Since(c.lastPrune) > time.Minute {
		c.lastPrune = time.Now()
		keep := c.cfg.KeepPlans
		if keep <= 0 {
			keep = DefaultKeepPlans
		}
		if n, err := c.store.Prune(ctx, keep); err != nil {
			c.log.Warn("pruning old plans", "err", err)
		} else if n > 0 {
			c.log.Info("pruned old plans", "removed", n, "kept", keep)
		}
	}
	return nil
}

func (c *Controller) observe() {
	by := map[string]int{}
	blocked := 0
	for _, st := range c.plans {
		by[string(st.Outcome())]++
		blocked += st.Counts().Blocked
	}
	c.obs.Plans(by, blocked)
}

// WindowIdle is the Config.Window that publishes as many held asks as
// holders are idle.
const WindowIdle = -1

// planWindow is the window a plan's state gets: with WindowIdle, 1 between
// flushes (a released ask goes out at once when the plan has none queued),
// widened at each flush to what idle holders can take.
func (c *Controller) planWindow() int {
	if c.cfg.Window == WindowIdle {
		return 1
	}
	return c.cfg.Window
}

// fillIdle publishes, best first and oldest plan first, as many held asks
// as holders are waiting for work, read from the seat consumer's state. It
// reports whether asks are still held, so that the caller looks again soon:
// a holder that just announced built may not have asked for its next yet.
func (c *Controller) fillIdle(ctx context.Context) bool {
	var held []*State
	for _, st := range c.plans {
		if st.Counts().Ready > 0 {
			held = append(held, st)
		}
	}
	if len(held) == 0 {
		return false
	}
	idle, err := c.idleHolders(ctx)
	if err != nil {
		c.log.Warn("reading the seat's consumer; publishing one held ask per plan", "err", err)
		idle = len(held)
	}
	slices.SortFunc(held, func(a, b *State) int { return cmp.Compare(a.Seq, b.Seq) })
	now := time.Now().UTC()
	still := false
	for _, st := range held {
		if idle > 0 {
			st.Window = st.Counts().Queued + idle
			subs := st.Fill(now)
			idle -= len(subs)
			c.enqueue(st, subs)
			st.Window = c.planWindow()
		}
		still = still || st.Counts().Ready > 0
	}
	return still
}

// idleHolders is how many holders of the build seat wait for an ask now,
// less the asks already queued for them.
func (c *Controller) idleHolders(ctx context.Context) (int, error) {
	if c.seatConsumer == nil {
		cons, err := c.js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.SeatConsumer(mesh.BuildSeat))
		if err != nil {
			return 0, err
		}
		c.seatConsumer = cons
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.seatConsumer.Info(ictx)
	if err != nil {
		return 0, err
	}
	return max(0, info.NumWaiting-int(info.NumPending)), nil
}
