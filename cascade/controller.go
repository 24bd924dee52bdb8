package cascade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/seat"
)

// Observer is told what the controller does, for metrics.
type Observer interface {
	PlanSettled(outcome string, d time.Duration)
	Plans(byOutcome map[string]int, blocked int)
}

// ModulesObserver is told, on every observation, how many modules of the
// plans the controller holds are in each state (ModuleState names), so
// that unchanged and superseded modules are counted beside built ones. An
// Observer that implements it is told.
type ModulesObserver interface {
	Modules(byState map[string]int)
}

// ForecastObserver is told, on every observation, each running plan's
// estimated remaining time (Forecast.Remaining), by plan (metrics). An
// Observer that implements it is told.
type ForecastObserver interface {
	PlansRemaining(byPlan map[string]time.Duration)
}

type nopObserver struct{}

func (nopObserver) PlanSettled(string, time.Duration) {}
func (nopObserver) Plans(map[string]int, int)         {}

// SettledPlan is a plan that settled, as deployment receives it: its
// record and its modules (copies: the receiver may keep them).
type SettledPlan struct {
	Record  PlanRecord
	Modules []ModuleStatus
}

// Settler is where a settled plan hands over to deployment: it is told of
// every plan that settles, on the controller's goroutine, after the plan's
// state is stored and its asks are published. It must not block for long;
// an error is logged and not retried (the plan stays settled).
type Settler interface {
	Settled(ctx context.Context, plan SettledPlan) error
}

// Controller turns triggers into plans and built/failed into the next asks.
// One goroutine owns all plan state; tool requests reach it by channel.
type Controller struct {
	cfg     Config
	settler Settler
	js      jetstream.JetStream
	nc      *nats.Conn
	log     *slog.Logger
	obs     Observer
	module  string

	cat *mesh.Catalogue
	// catPlatforms is cat.Platforms(), kept with cat: every flush that
	// holds asks reads it, and deriving it parses every module's
	// platforms.
	catPlatforms []string
	ix           *planner.Index
	store        *Store

	plans   map[string]*State
	current map[string]Current
	// keys are the input keys built, with what they were built to.
	keys map[string]KeyRecord
	// trees resolves build contexts' tree ids (nil: no input keys).
	trees  *gitcache.Cache
	seq    uint64
	askSeq map[string]uint64
	cmds   seat.Inbox[command, Reply]

	lastPrune time.Time
	// held is set when asks are held for idle holders (WindowIdle).
	held bool
	// seatConsumers are the build seat's holders' consumers, by platform.
	seatConsumers map[string]jetstream.Consumer
	// askPlatform is the platform of each ask published (with askSeq).
	askPlatform map[string]string
	// platforms is what the controller saw of each platform's holders.
	platforms platformWatch
	// asks is the build seat's ask claims bucket the fence reads; nil
	// until Run opens it.
	asks jetstream.KeyValue
	// attempts is the latest attempt of each ask whose start was applied:
	// an outcome of an older one is refused (the fence).
	attempts map[string]int
	// lastBuild is each module's last build duration, the estimate that
	// ranks a new plan's asks.
	lastBuild map[string]time.Duration
	// storedBuild is each module's estimate as the store has it (see
	// estimateMoved).
	storedBuild map[string]time.Duration
	// forecasts are the running plans' forecasts last written with their
	// records (see record); forecastOwed are the plans whose record was
	// written with an older one, to be written again once it is due.
	forecasts    map[string]Forecast
	forecastOwed map[string]bool
	// sched is the scheduling across plans (scheduler.go).
	sched scheduler

	// a batch's pending effects
	dirty    map[string]any
	dirtyRun map[string]bool
	submits  []Submit
}

// New returns a controller for a checked catalogue, from a validated
// config (every zero field its default, see Config).
func New(cfg Config, js jetstream.JetStream, cat *mesh.Catalogue, log *slog.Logger, obs Observer) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
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
		cat: cat, catPlatforms: cat.Platforms(), ix: planner.NewIndex(cat),
		storedBuild: map[string]time.Duration{}, forecasts: map[string]Forecast{}, forecastOwed: map[string]bool{},
		plans: map[string]*State{}, current: map[string]Current{}, askSeq: map[string]uint64{},
		cmds: make(seat.Inbox[command, Reply], 64), lastBuild: map[string]time.Duration{},
		keys: map[string]KeyRecord{}, trees: treeCache(cfg),
		seatConsumers: map[string]jetstream.Consumer{}, askPlatform: map[string]string{},
		platforms: platformWatch{since: time.Now(), seen: map[string]time.Time{}},
		attempts:  map[string]int{},
		sched:     scheduler{shares: map[string]Share{}, held: map[string]string{}},
	}, nil
}

// treeCache is the controller's clones of the modules' repositories, if it
// keeps them (Config.Sources).
func treeCache(cfg Config) *gitcache.Cache {
	if cfg.Sources == "" {
		return nil
	}
	return &gitcache.Cache{Dir: cfg.Sources, InsteadOf: cfg.InsteadOf}
}

// SetSettler sets where settled plans are handed over (see Settler); call
// it before Run. Without one, a settled plan is only recorded.
func (c *Controller) SetSettler(s Settler) { c.settler = s }

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
func (c *Controller) Image(module string) string { return Image(c.cfg.Registry, module) }

// raise asserts cat's wire, retrying (with backoff, said in the log) while
// the bus does not answer in time: a controller that starts while a
// cluster elects its leaders waits for them instead of stopping. A refusal
// is returned at once.
func (c *Controller) raise(ctx context.Context, cat *mesh.Catalogue) (mesh.RaiseReport, error) {
	retry := backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		r, err := mesh.Raise(ctx, c.js, cat, c.cfg.Replicas)
		if err == nil || ctx.Err() != nil || !unanswered(err) {
			return r, err
		}
		c.log.Warn("raising the catalogue: the bus did not answer; retrying", "err", err, "attempt", attempt)
		if backoff.Wait(ctx, retry.Delay(attempt)) != nil {
			return r, err
		}
	}
}

// unanswered reports whether err is the bus not answering in time, not a
// refusal (mesh.Unanswered).
func unanswered(err error) bool { return mesh.Unanswered(err) }

// Run raises the catalogue, resumes the plans in the store and works until
// ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	r, err := c.raise(ctx, c.cat)
	if err != nil {
		return err
	}
	c.logRaise(r)
	if c.store, err = OpenStore(ctx, c.js, c.module); err != nil {
		return err
	}
	if c.asks, err = c.js.KeyValue(ctx, mesh.AskClaimsBucket(mesh.BuildSeat)); err != nil {
		// Raised above with the catalogue; a catalogue without the build
		// seat has no outcomes to fence.
		c.log.Warn("no ask claims bucket: every outcome of the build seat is refused", "err", err)
		c.asks = nil
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
	// The asks the server gave up on, from the stream that kept its
	// advisories while no controller ran as well as now.
	gaveUp, stopGaveUp, err := c.consumeGaveUp(ctx)
	if err != nil {
		return err
	}
	defer stopGaveUp()
	// On the way out, events fetched and not worked go back at once, so
	// the next holder of mesh-controller has them without an ack wait.
	events, stopEvents, err := c.consume(ctx, mesh.EventsStream, mesh.ModuleConsumer(c.module), c.cfg.Batch, "events")
	if err != nil {
		return err
	}
	defer stopEvents()
	c.log.Info("controller running", "module", c.module, "plans", len(c.plans))

	tick := time.NewTicker(c.cfg.ObserveEvery)
	defer tick.Stop()
	for {
		var batch []jetstream.Msg
		var look, forecast <-chan time.Time
		if c.held {
			look = time.After(c.cfg.IdleLook)
		}
		if due, ok := c.forecastDue(); ok {
			forecast = time.After(time.Until(due))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-look:
		case <-forecast:
			// Records written with an older forecast get a fresh one.
			for id := range c.forecastOwed {
				if st := c.plans[id]; st != nil {
					c.touch(st)
				}
				delete(c.forecastOwed, id)
			}
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
			verdicts := c.fence(ctx, batch)
			kept := batch[:0]
			for _, m := range batch {
				if !c.event(ctx, m, verdicts) {
					kept = append(kept, m)
				}
			}
			batch = kept
		case cmd := <-c.cmds:
			cmd.Answer(c.command(ctx, cmd.Q))
		case m, ok := <-gaveUp:
			if !ok {
				return errors.New("the consumer of given-up asks stopped")
			}
			c.abandoned(ctx, m.Data(), time.Now().UTC())
			// Acknowledged with the batch, once the failure is stored.
			batch = append(batch, m)
		case <-tick.C:
			c.observe()
			now := time.Now().UTC()
			cancels, expired := c.expireCancels(now), c.expireAsks(now)
			noted := c.watchPlatforms(ctx)
			indexed := c.assemble(ctx, true)
			if !cancels && !expired && !noted && !indexed && !c.unflushed() {
				continue
			}
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
	if c.keys, err = c.store.Keys(ctx); err != nil {
		return err
	}
	if c.sched.shares, err = c.store.Shares(ctx); err != nil {
		return err
	}
	est, err := c.store.Estimates(ctx)
	if err != nil {
		return err
	}
	for m, d := range est {
		c.storedBuild[m] = d
		if _, ok := c.lastBuild[m]; !ok {
			c.lastBuild[m] = d
		}
	}
	c.seedEstimates(ctx)
	var since time.Time
	for _, r := range recs {
		c.seq = max(c.seq, r.Seq)
		if r.Outcome != OutcomeRunning {
			continue
		}
		st, err := c.load(ctx, r)
		if err != nil {
			c.log.Error("cannot load a stored plan; leaving it", "plan", r.ID, "err", err)
			continue
		}
		st.Window = c.planWindow()
		c.plans[r.ID] = st
		// Level-triggered too: a crash mid-persist may have stored a
		// module built without its current image, or every module
		// finished without the plan's record; the record is written again
		// (and the plan settled, if it is) and the current images made.
		c.touch(st)
		for _, m := range st.Modules {
			if cur, ok := st.Current(m.Module); ok && Newer(cur, c.current[m.Module]) {
				c.current[m.Module] = cur
				c.dirty[CurrentKey(m.Module)] = cur
			}
		}
		if since.IsZero() || r.Updated.Before(since) {
			since = r.Updated
		}
	}
	// What the holders said while the controller was away is applied
	// before anything is submitted again: an ask whose module was built
	// meanwhile is not published again, even past the queue's duplicate
	// window (a controller stopped for longer), so nothing is built twice.
	if len(c.plans) > 0 {
		if err := c.replay(ctx, since.Add(-replayMargin)); err != nil {
			return err
		}
	}
	now := time.Now().UTC()
	c.expireAsks(now)
	c.rewindow()
	for id, st := range c.plans {
		c.enqueue(st, st.Pending())
		c.enqueue(st, st.Start(now))
		if asks := st.Cancelling(); len(asks) > 0 {
			c.cancelOnHolders(asks)
		}
		c.log.Info("resumed a plan", "plan", id, "counts", fmt.Sprintf("%+v", st.Counts()))
	}
	return c.flush(ctx)
}

// replayMargin is how far before a plan's last stored change the replay of
// the holders' events begins: the clocks of the controller and the server
// may differ a little.
const replayMargin = time.Minute

// replay applies the build seat's events stored since a time, read through
// an ordered consumer of its own; the controller's consumer delivers them
// again later, and applying an event twice changes nothing.
func (c *Controller) replay(ctx context.Context, since time.Time) error {
	subjects := []string{
		mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventStarted),
		mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventBuilt),
		mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventFailed),
		mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventHandedBack),
	}
	cons, err := c.js.OrderedConsumer(ctx, mesh.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
	})
	if err != nil {
		return fmt.Errorf("replaying the holders' events: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("replaying the holders' events: %w", err)
	}
	n := 0
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("replaying the holders' events: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			c.event(ctx, m, nil)
		}
		if got == 0 {
			break
		}
		left -= uint64(got)
		n += got
	}
	c.log.Info("replayed the holders' events", "since", since, "events", n)
	return nil
}

// buildRetain is how long the build seat's queue keeps an ask.
func (c *Controller) buildRetain() time.Duration {
	if s, _, ok := c.cat.Seat(mesh.BuildSeat); ok {
		return mesh.SeatRetain(s)
	}
	return 0
}

// expireAsks fails the queued modules whose ask the seat's queue has
// dropped (its retain passed with nobody holding it). It reports whether
// any changed.
func (c *Controller) expireAsks(now time.Time) bool {
	retain := c.buildRetain()
	changed := false
	for _, st := range c.plans {
		if mods := st.Expire(now, retain); len(mods) > 0 {
			c.log.Warn("asks expired in the queue: nobody took them", "plan", st.Plan, "modules", mods, "retain", retain)
			c.touch(st, mods...)
			changed = true
		}
	}
	return changed
}

// consumeGaveUp consumes the build seat's GaveUpStream: the advisories of
// the asks the server gave up on.
func (c *Controller) consumeGaveUp(ctx context.Context) (<-chan jetstream.Msg, func(), error) {
	return c.consume(ctx, mesh.GaveUpStream(mesh.BuildSeat), mesh.GaveUpConsumer(), 16, "given-up asks")
}

// consume binds the durable consumer on stream and delivers its messages
// on a channel, closed if the consumer stops (seat.Consume); stop ends it.
func (c *Controller) consume(ctx context.Context, stream, consumer string, batch int, what string) (<-chan jetstream.Msg, func(), error) {
	s, err := seat.Consume(ctx, c.js, stream, consumer, batch, what, c.log)
	if err != nil {
		return nil, nil, err
	}
	return s.Messages(), s.Stop, nil
}

// abandoned works the server's word that it gave up on an ask of the build
// seat (delivered its consumer's max delivery count, never settled; data
// is the advisory): the module fails for infrastructure, its dependents
// are blocked, and the ask is taken out of the queue. An advisory of an ask
// no running plan waits for (settled, or retried since) only takes it out.
func (c *Controller) abandoned(ctx context.Context, data []byte, now time.Time) {
	var adv struct {
		Stream     string `json:"stream"`
		Consumer   string `json:"consumer"`
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries uint64 `json:"deliveries"`
	}
	if err := json.Unmarshal(data, &adv); err != nil || adv.StreamSeq == 0 {
		c.log.Warn("unreadable max-deliveries advisory", "err", err)
		return
	}
	stream, err := c.js.Stream(ctx, adv.Stream)
	if err != nil {
		c.log.Warn("an ask was given up on; its stream cannot be read", "stream", adv.Stream, "seq", adv.StreamSeq, "err", err)
		return
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if err != nil {
		c.log.Warn("an ask was given up on and is gone from its queue", "stream", adv.Stream, "seq", adv.StreamSeq, "err", err)
		return
	}
	ask, err := mesh.DecodeAsk(raw.Data)
	if err == nil {
		if st := c.plans[ask.Plan]; st != nil {
			if mod, blocked, ok := st.Abandoned(ask.ID, int(adv.Deliveries), now); ok {
				c.log.Error("the bus gave up on an ask: failed", "plan", ask.Plan, "module", mod, "ask", ask.ID, "deliveries", adv.Deliveries)
				c.touch(st, mod)
				c.touch(st, blocked...)
			}
		}
	}
	if err := stream.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		c.log.Warn("taking a given-up ask out of its queue", "seq", adv.StreamSeq, "err", err)
	}
}

// load rebuilds a stored plan's state: planned again from its trigger, its
// modules from the store. A plan stored before its external bases were
// kept with it is pinned now, once.
func (c *Controller) load(ctx context.Context, r PlanRecord) (*State, error) {
	p, err := c.ix.Plan(r.Trigger)
	if err != nil {
		return nil, fmt.Errorf("planning it again: %w", err)
	}
	mods, err := c.store.Modules(ctx, r.ID)
	if err != nil {
		return nil, err
	}
	st, err := Load(p, r, mods)
	if err != nil {
		return nil, err
	}
	st.SetKnown(c.known)
	if len(p.External) > 0 && len(st.External) == 0 {
		if err := c.pin(ctx, st, p); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// event works one event of the controller's consumer. Every event is read
// with mesh.DecodeEvent (its version checked); one that cannot be read is
// refused once (Term) and holds up nothing. An outcome of the build seat is
// applied only if the fence lets it (verdicts, from fence; one missing is
// checked here). It reports whether it settled the message itself
// (refused, or to be looked at again): the caller acknowledges the others
// once the batch is stored.
func (c *Controller) event(ctx context.Context, m jetstream.Msg, verdicts map[jetstream.Msg]*verdict) (settled bool) {
	now := time.Now().UTC()
	refuse := func(err error) bool {
		c.log.Warn("refusing an event", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return true
	}
	if m.Subject() == mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed) {
		ev, err := mesh.DecodeEvent[mesh.Pushed](m.Data())
		if err != nil {
			return refuse(err)
		}
		t := planner.Trigger{Kind: planner.KindPush, Repo: ev.Repo, Commit: ev.Commit, Ref: ev.Ref, Paths: ev.Paths}
		// A push's plan is as new as the push's place on the bus, not as
		// the moment it is planned: a push delivered again after a crash,
		// behind a newer push already planned, stays the older.
		var at uint64
		if md, err := m.Metadata(); err == nil {
			at = md.Sequence.Stream
		}
		if _, _, err := c.createPlan(ctx, t, ev.Schedule, now, at); err != nil {
			c.log.Warn("no plan for a push", "repo", ev.Repo, "commit", ev.Commit, "err", err)
		}
		return false
	}
	seat, _, event, ok := mesh.SplitHolderEventSubject(m.Subject())
	if !ok || seat != mesh.BuildSeat {
		return false // not the controller's to work
	}
	v, checked := verdicts[m]
	if !checked {
		v = c.check(ctx, m)
	}
	switch {
	case v != nil && v.retry:
		c.log.Warn("cannot check an event yet; looking again shortly", "subject", m.Subject(), "err", v.err)
		_ = m.NakWithDelay(fenceRetry)
		return true
	case v != nil:
		c.refuse(m, v)
		return true
	}
	switch event {
	case mesh.EventStarted:
		ev, _ := mesh.DecodeEvent[mesh.Started](m.Data())
		if c.stale(ev.Ask, ev.Attempt) {
			c.refuse(m, &verdict{reason: RefusedStale, err: fmt.Errorf("attempt %d of ask %s started after attempt %d", ev.Attempt, ev.Ask, c.attempts[ev.Ask])})
			return true
		}
		c.attempts[ev.Ask] = max(c.attempts[ev.Ask], ev.Attempt)
		if st := c.plans[ev.Plan]; st != nil && st.Started(ev) {
			c.touch(st, ev.Module)
			if ms, _ := st.Module(ev.Module); ms.State == Cancelling {
				// Taken as the plan was cancelled: the holder may have
				// missed the first word.
				c.cancelOnHolders([]string{ev.Ask})
			}
		}
	case mesh.EventBuilt:
		ev, _ := mesh.DecodeEvent[mesh.Built](m.Data())
		if c.stale(ev.Ask, ev.Attempt) {
			c.refuse(m, &verdict{reason: RefusedStale, err: fmt.Errorf("built by attempt %d of ask %s, after attempt %d started", ev.Attempt, ev.Ask, c.attempts[ev.Ask])})
			return true
		}
		// The image is the module's own repository's, whatever the event
		// says: that is where the fence found the digest.
		ev.Image = c.Image(ev.Module) + "@" + ev.Digest
		delete(c.attempts, ev.Ask)
		st := c.plans[ev.Plan]
		if st == nil {
			return false
		}
		if _, ok := st.Module(ev.Module); !ok {
			return false
		}
		c.built(st, ev, now)
	case mesh.EventFailed:
		ev, _ := mesh.DecodeEvent[mesh.Failed](m.Data())
		if c.stale(ev.Ask, ev.Attempt) {
			c.refuse(m, &verdict{reason: RefusedStale, err: fmt.Errorf("failed by attempt %d of ask %s, after attempt %d started", ev.Attempt, ev.Ask, c.attempts[ev.Ask])})
			return true
		}
		delete(c.attempts, ev.Ask)
		if st := c.plans[ev.Plan]; st != nil {
			blocked := st.Failed(ev, now)
			c.touch(st, ev.Module)
			c.touch(st, blocked...)
		}
	case mesh.EventHandedBack:
		// A note on the module, not an outcome: the ask is back in the
		// queue, to be retried or waiting for a healthy machine.
		ev, _ := mesh.DecodeEvent[mesh.HandedBack](m.Data())
		if c.stale(ev.Ask, ev.Attempt) {
			c.refuse(m, &verdict{reason: RefusedStale, err: fmt.Errorf("attempt %d of ask %s handed back, after attempt %d started", ev.Attempt, ev.Ask, c.attempts[ev.Ask])})
			return true
		}
		c.attempts[ev.Ask] = max(c.attempts[ev.Ask], ev.Attempt)
		if st := c.plans[ev.Plan]; st != nil && st.HandedBack(ev) {
			c.touch(st, ev.Module)
		}
	}
	return false
}

// fenceRetry is how soon an event the fence could not check (the registry
// or the bus did not answer) is looked at again.
const fenceRetry = 2 * time.Second

// built applies a built event (a holder's, or an index the controller
// pushed): the module's state, its estimate, its current image and the asks
// it releases.
func (c *Controller) built(st *State, ev mesh.Built, now time.Time) {
	before, _ := st.Module(ev.Module)
	next := st.Built(ev, now)
	c.touch(st, ev.Module)
	if ms, _ := st.Module(ev.Module); ms.State == Built && before.State != Built {
		c.charge(st, ev.Duration, now)
	}
	if ev.Duration > 0 {
		c.lastBuild[ev.Module] = ev.Duration
		if estimateMoved(c.storedBuild[ev.Module], ev.Duration) {
			c.storedBuild[ev.Module] = ev.Duration
			c.dirty[EstimateKey(ev.Module)] = ev.Duration
		}
	}
	if ms, _ := st.Module(ev.Module); ms.State == Built && ms.Key != "" && ms.Digest == ev.Digest {
		rec := KeyRecord{Digest: ms.Digest, Image: ms.Image, Module: ms.Module, Plan: st.Plan, Commit: ms.Commit}
		c.keys[ms.Key] = rec
		c.dirty[InputKeyKey(ms.Key)] = rec
	}
	if cur, ok := st.Current(ev.Module); ok && cur.Digest == ev.Digest {
		c.setCurrent(st, ev.Module)
	}
	c.enqueue(st, next)
}

// assemble pushes the image index of every module whose platforms are all
// built (State.Unindexed) and records it as the module's built: the index
// digest is its digest, its current image and what its dependents are
// pinned to. It looks at the plans the batch changed, or at every plan
// (all: on the tick, to retry an index the registry refused). It reports
// whether any module was built so.
func (c *Controller) assemble(ctx context.Context, all bool) bool {
	some := false
	for id, st := range c.plans {
		if !all && !c.dirtyRun[id] {
			continue
		}
		for _, u := range st.Unindexed() {
			begun := time.Now()
			rctx, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
			ms, _ := st.Module(u.Module)
			dg, err := c.cfg.RegistryClient.PushIndex(rctx, c.Image(u.Module), u.Manifests, indexAnnotations(ms))
			cancel()
			if err != nil {
				c.log.Warn("pushing a module's image index; retrying on the next tick", "plan", id, "module", u.Module, "err", err)
				continue
			}
			c.log.Info("pushed an image index", "plan", id, "module", u.Module, "digest", dg, "platforms", len(u.Manifests), "took", time.Since(begun))
			c.built(st, mesh.Built{
				Version: mesh.AskVersion, Ask: u.Ask, Plan: id, Module: u.Module, Commit: ms.Commit,
				Digest: dg, Image: c.Image(u.Module) + "@" + dg, On: ms.On, At: time.Now().UTC(),
			}, time.Now().UTC())
			some = true
		}
	}
	return some
}

// createPlan plans a trigger and starts it; a plan that exists already is
// not made again (created false).
//
// The bases outside the plan are resolved here, once, before anything is
// stored: the plan's asks are all pinned to them. A base that has no image
// (never built, and no latest tag in the registry) refuses the plan with an
// error wrapping ErrNoBase that names the base and the command that builds
// it: the requester of a rebuild gets it as the tool's answer, and a push is
// logged and leaves no plan, so announcing the same push again once the
// base is built makes the plan. (Marking only the modules built on it
// blocked would leave a plan that no retry can mend: the base is outside
// it.)
//
// A plan's sequence number (State.Seq, what makes a plan newer) is at, the
// trigger's place on the bus (a push's EVENTS sequence), when it has one;
// else (a tool's request, at 0) the next after every plan made so far.
func (c *Controller) createPlan(ctx context.Context, t planner.Trigger, sched *mesh.Schedule, now time.Time, at uint64) (PlanRecord, bool, error) {
	p, err := c.ix.Plan(t)
	if err != nil {
		return PlanRecord{}, false, err
	}
	if st, ok := c.plans[p.ID]; ok {
		return Record(st), false, nil
	}
	if old, err := c.store.Plan(ctx, p.ID); err == nil {
		return old, false, nil
	} else if !errors.Is(err, ErrNoPlan) {
		return PlanRecord{}, false, err
	}
	st := NewState(p, now)
	if err := c.pin(ctx, st, p); err != nil {
		return PlanRecord{}, false, fmt.Errorf("planning %s: %w", p.ID, err)
	}
	c.address(ctx, st)
	c.previous(ctx, st)
	st.SetKnown(c.known)
	st.Seq = c.seq + 1
	if at > 0 {
		st.Seq = at
	}
	st.Window = c.planWindow()
	if len(c.lastBuild) > 0 {
		st.SetEstimates(c.lastBuild)
	}
	if err := c.planSchedule(st, sched); err != nil {
		return PlanRecord{}, false, fmt.Errorf("planning %s: %w", p.ID, err)
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
	c.seq = max(c.seq, st.Seq)
	c.log.Info("plan", "plan", p.ID, "trigger", st.Summary, "modules", len(p.Modules), "tiers", len(p.Tiers))
	if p.Empty() {
		return rec, true, nil
	}
	c.plans[p.ID] = st
	c.supersede(ctx, st, c.cfg.CancelSuperseded || (sched != nil && sched.CancelSuperseded), now)
	c.rewindow()
	c.enqueue(st, st.Start(now))
	for _, m := range st.Modules {
		c.touch(st, m.Module)
	}
	return rec, true, nil
}

// pin resolves the plan's bases outside it and pins the state to them.
func (c *Controller) pin(ctx context.Context, st *State, p planner.Plan) error {
	digests := make(map[string]string, len(p.External))
	var errs []error
	for _, e := range p.External {
		d, err := c.currentDigest(ctx, e.Module)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w (needed by %s)", err, strings.Join(e.NeededBy, ", ")))
			continue
		}
		digests[e.Module] = d
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return st.Pin(digests)
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
		c.dirty = map[string]any{}
	}
	if c.dirtyRun == nil {
		c.dirtyRun = map[string]bool{}
	}
	c.dirtyRun[st.Plan] = true
	for _, m := range modules {
		if ms, ok := st.Module(m); ok {
			c.dirty[ModuleKey(st.Plan, m)] = ms
		}
	}
}

// enqueue keeps submits for the next flush, and records the modules the
// state settled unchanged on the way.
func (c *Controller) enqueue(st *State, subs []Submit) {
	for _, s := range subs {
		c.touch(st, s.Module)
		c.submits = append(c.submits, s)
	}
	for _, m := range st.Reused() {
		c.touch(st, m)
		c.setCurrent(st, m)
	}
}

// setCurrent makes a module's image in a plan its current one, if the plan
// is newer than the one that made the current one.
func (c *Controller) setCurrent(st *State, module string) {
	if cur, ok := st.Current(module); ok && Newer(cur, c.current[module]) {
		c.current[module] = cur
		if c.dirty == nil {
			c.dirty, c.dirtyRun = map[string]any{}, map[string]bool{}
		}
		c.dirty[CurrentKey(module)] = cur
	}
}

// known looks an input key up among those built.
func (c *Controller) known(key string) (KeyRecord, bool) {
	r, ok := c.keys[key]
	return r, ok
}

// address resolves, from the controller's clones, each module's commit and
// the tree id of its build context, one fetch per repository and commit. A
// module whose context cannot be resolved (the repository unreachable, the
// path missing) is left unaddressed and logged: it has no input key, and is
// dispatched (its agent reports what is wrong with its source).
func (c *Controller) address(ctx context.Context, st *State) {
	if c.trees == nil {
		return
	}
	type source struct{ repo, commit string }
	paths := map[source][]string{}
	for _, m := range st.Modules {
		k := source{m.Source.Repo, m.Source.Commit}
		paths[k] = append(paths[k], m.Source.Path)
	}
	inputs := map[string]Inputs{}
	for k, ps := range paths {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
		res, err := c.trees.Resolve(rctx, k.repo, k.commit, ps)
		cancel()
		if err != nil {
			c.log.Warn("build contexts not addressed: their modules are dispatched", "plan", st.Plan, "repo", k.repo, "err", err)
			continue
		}
		for _, m := range st.Modules {
			if m.Source.Repo == k.repo && m.Source.Commit == k.commit {
				inputs[m.Module] = Inputs{Commit: res.Commit, Tree: res.Trees[m.Source.Path]}
			}
		}
	}
	st.Address(inputs)
}

// currentDigest is a base's current digest: the newest plan's result, or
// else the identity of what the registry's latest tag names now (the
// image, not the index of it and its attestations: registry.Identity).
func (c *Controller) currentDigest(ctx context.Context, module string) (string, error) {
	if cur, ok := c.current[module]; ok && cur.Digest != "" {
		return cur.Digest, nil
	}
	ref := c.Image(module) + ":latest"
	rctx, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
	defer cancel()
	dg, err := c.cfg.RegistryClient.Identity(rctx, ref)
	if err != nil {
		return "", fmt.Errorf("%w: base %s (%s: %v): build it first with `builds rebuild %s`", ErrNoBase, module, ref, err, module)
	}
	return dg, nil
}

// flush makes a batch's effects durable and visible, retrying (with
// backoff) for at most Config.StoreRetryFor: events are acknowledged only
// after it. Its steps, in order: persist the state, publish the asks of
// the plans stored, settle what settled (the hand-over to deployment),
// prune old plans. A plan whose state the store still refuses when the
// bound passes is reported; its writes and asks wait for the next flush,
// and the other plans go on.
func (c *Controller) flush(ctx context.Context) error {
	c.assemble(ctx, false)
	c.fillWindows(ctx)
	retry := backoff.Policy{First: 100 * time.Millisecond, Max: 10 * time.Second}
	deadline := time.Now().Add(c.cfg.StoreRetryFor)
	for attempt := 1; ; attempt++ {
		err := c.flushOnce(ctx)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			c.log.Error("could not store plan state; going on without it and trying again at the next flush",
				"plans", slices.Sorted(maps.Keys(c.dirtyRun)), "after", c.cfg.StoreRetryFor, "err", err)
			return nil
		}
		c.log.Warn("writing plan state failed; retrying", "err", err, "attempt", attempt)
		if backoff.Wait(ctx, min(retry.Delay(attempt), left)) != nil {
			return nil
		}
	}
}

// unflushed reports whether writes or asks wait for the next flush.
func (c *Controller) unflushed() bool { return len(c.dirty)+len(c.submits) > 0 }

// fillWindows releases held asks into the room the batch made: with a
// window, a plan whose state changed (a started, above all) publishes the
// best held asks its window now has room for; with WindowIdle, as many as
// holders are idle.
func (c *Controller) fillWindows(ctx context.Context) {
	c.observeDispatched()
	for id := range c.dirtyRun {
		if st := c.plans[id]; st != nil && c.cfg.Window > 0 {
			st.Window = c.cfg.Window
			c.enqueue(st, st.Fill(time.Now().UTC()))
		}
	}
	if c.cfg.Window == WindowIdle {
		c.held = c.fillIdle(ctx)
	}
}

func (c *Controller) flushOnce(ctx context.Context) error {
	perr := c.persist(ctx)
	// A plan with a write still refused keeps its asks, unpublished, and
	// is not settled: an ask goes out only once the state that says it is
	// queued is stored.
	held := map[string]bool{}
	for k := range c.dirty {
		if p, ok := PlanOfKey(k); ok {
			held[p] = true
		}
	}
	var asks []mesh.Ask
	var keep []Submit
	seen := map[string]bool{}
	for _, sub := range c.submits {
		switch {
		case held[sub.Plan]:
			keep = append(keep, sub)
		case !seen[sub.AskID]:
			seen[sub.AskID] = true
			asks = append(asks, Asks(c.cfg.Registry, sub)...)
		}
	}
	if err := c.publish(ctx, asks); err != nil {
		return err
	}
	c.submits = keep
	settled := c.settle(ctx, held)
	for id := range c.dirtyRun {
		if !held[id] {
			delete(c.dirtyRun, id)
		}
	}
	if settled {
		c.prune(ctx)
	}
	return perr
}

// persist stores every changed module, estimate, current image and plan
// record. It comes first: an ask is published only once the state that
// says it is queued is stored, so a restart re-submits every queued ask
// (deduplicated by id) and none is lost.
//
// The keys are written in parallel, so a crash can store any part of one
// phase: the phases are ordered so that every part is a state a restart
// resumes correctly. First what modules finished (built, failed, blocked,
// cancelled), with the current images and estimates; then what the
// finished ones released (queued, building, …): a dependent is never
// stored queued, its ask pinned to a base's digest, before that base is
// stored built. Last the plan records: a record that says the plan settled
// is stored only after everything it settled, so a crash before it leaves
// the plan running, to be resumed, and its events (unacknowledged)
// delivered again
// What a phase stored leaves c.dirty; what the store refused stays, for
// the next try, and the later phases wait for it.
func (c *Controller) persist(ctx context.Context) error {
	if c.dirty == nil {
		c.dirty = map[string]any{}
	}
	for id := range c.dirtyRun {
		if st := c.plans[id]; st != nil {
			c.dirty[PlanKey(id)] = c.record(st)
		}
	}
	finished, released, records := map[string]any{}, map[string]any{}, map[string]any{}
	for k, v := range c.dirty {
		switch v := v.(type) {
		case PlanRecord:
			records[k] = v
		case ModuleStatus:
			if !v.State.Finished() {
				released[k] = v
				continue
			}
			finished[k] = v
		default:
			finished[k] = v
		}
	}
	for _, phase := range []map[string]any{finished, released, records} {
		if len(phase) == 0 {
			continue
		}
		err := c.store.Put(ctx, phase)
		var pe *PutError
		switch {
		case err == nil:
			for k := range phase {
				delete(c.dirty, k)
			}
		case errors.As(err, &pe):
			for k := range phase {
				if pe.Failed[k] == nil {
					delete(c.dirty, k)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// record is a plan's record with, while it runs, its forecast: from the
// modules' last build times, spread over the holders last seen.
//
// The forecast is computed again at most every ForecastEvery: a record
// written sooner carries the last one (its At says when it was made).
func (c *Controller) record(st *State) PlanRecord {
	r := Record(st)
	r.Held = c.sched.held[st.Plan]
	if r.Outcome != OutcomeRunning {
		delete(c.forecasts, st.Plan)
		delete(c.forecastOwed, st.Plan)
		return r
	}
	now := time.Now().UTC()
	f, ok := c.forecasts[st.Plan]
	if !ok || now.Sub(f.At) >= ForecastEvery || now.Before(f.At) {
		f = st.Forecast(c.lastBuild, now, c.platforms.holders)
		c.forecasts[st.Plan] = f
		delete(c.forecastOwed, st.Plan)
	} else {
		c.forecastOwed[st.Plan] = true
	}
	r.Forecast = &f
	return r
}

// forecastDue is when the first record written with an older forecast is
// to be written again with a fresh one (ForecastEvery after the one it
// carries), if any is.
func (c *Controller) forecastDue() (time.Time, bool) {
	var due time.Time
	for id := range c.forecastOwed {
		f, ok := c.forecasts[id]
		if !ok || c.plans[id] == nil {
			delete(c.forecastOwed, id)
			continue
		}
		if at := f.At.Add(ForecastEvery); due.IsZero() || at.Before(due) {
			due = at
		}
	}
	return due, !due.IsZero()
}

// estimateMoved reports whether a module's build duration now differs
// enough from the one stored to be written again: by more than a tenth,
// or than EstimateSlack, whichever is larger. The estimate only ranks asks
// (and forecasts); the controller ranks by the exact last duration it
// holds in memory, and the stored copy is what a restarted controller
// starts from, where a difference this small changes no ranking that
// matters. Writing it on every build was one store write per module.
func estimateMoved(stored, now time.Duration) bool {
	if stored <= 0 {
		return true
	}
	diff := now - stored
	if diff < 0 {
		diff = -diff
	}
	return diff > max(stored/10, EstimateSlack)
}

// EstimateSlack is the smallest change of a module's build duration that
// is written to the store (estimateMoved).
const EstimateSlack = 500 * time.Millisecond

// ForecastEvery is how often, at most, a running plan's forecast is
// computed again for its record (CriticalPath walks every module); a
// record written sooner carries the last one, which says when it was made
// (Forecast.At).
const ForecastEvery = time.Second

// Finished reports whether a module in state s has its result in its plan
// (built, unchanged, failed, blocked, cancelled, superseded; until a
// retry): what persist stores before what it released, and what a watch
// waits for.
func (s ModuleState) Finished() bool {
	return s == Built || s == Unchanged || s == Failed || s == Blocked || s == Cancelled || s == Superseded
}

// publish submits the asks to the build seat, each with its id as the
// message id, and waits for the bus to store them all.
func (c *Controller) publish(ctx context.Context, asks []mesh.Ask) error {
	if len(asks) == 0 {
		return nil
	}
	futures := make([]jetstream.PubAckFuture, 0, len(asks))
	for _, a := range asks {
		data, _ := json.Marshal(a)
		f, err := c.js.PublishAsync(mesh.BuildSubject(a.Platform), data, jetstream.WithMsgID(a.ID))
		if err != nil {
			return fmt.Errorf("submitting %s: %w", a.ID, err)
		}
		futures = append(futures, f)
	}
	select {
	case <-c.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(c.cfg.PublishAckWait):
		return fmt.Errorf("submitting asks: no acknowledgement in %s", c.cfg.PublishAckWait)
	}
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			c.askSeq[asks[i].ID] = ack.Sequence
			c.askPlatform[asks[i].ID] = asks[i].Platform
		case err := <-f.Err():
			return fmt.Errorf("submitting %s: %w", asks[i].ID, err)
		}
	}
	return nil
}

// settle reports the batch's plans that settled, hands each to the
// Settler (deployment), and forgets those that are finished (built or
// cancelled; a failed plan stays for a retry). It reports whether any plan
// settled.
func (c *Controller) settle(ctx context.Context, held map[string]bool) bool {
	some := false
	for id := range c.dirtyRun {
		if held[id] {
			continue
		}
		st := c.plans[id]
		if st == nil || !st.Settled() {
			continue
		}
		some = true
		rec := Record(st)
		c.obs.PlanSettled(string(rec.Outcome), rec.Updated.Sub(rec.Created))
		c.log.Info("plan settled", "plan", id, "outcome", rec.Outcome, "counts", fmt.Sprintf("%+v", rec.Counts))
		if c.settler != nil {
			if err := c.settler.Settled(ctx, SettledPlan{Record: rec, Modules: slices.Clone(st.Modules)}); err != nil {
				c.log.Warn("handing a settled plan over", "plan", id, "err", err)
			}
		}
		if rec.Outcome == OutcomeBuilt || rec.Outcome == OutcomeCancelled {
			delete(c.plans, id)
		}
	}
	return some
}

// prune removes the oldest settled plans beyond Config.KeepPlans, and the
// input keys that went with them (Store.PruneKeys), at most once every
// Config.PruneEvery.
func (c *Controller) prune(ctx context.Context) {
	if time.Since(c.lastPrune) < c.cfg.PruneEvery {
		return
	}
	c.lastPrune = time.Now()
	if n, err := c.store.Prune(ctx, c.cfg.KeepPlans); err != nil {
		c.log.Warn("pruning old plans", "err", err)
	} else if n > 0 {
		c.log.Info("pruned old plans", "removed", n, "kept", c.cfg.KeepPlans)
	}
	keys, err := c.store.PruneKeys(ctx)
	for k, r := range keys {
		if c.keys[k].Plan == r.Plan { // not built again since
			delete(c.keys, k)
		}
	}
	if err != nil {
		c.log.Warn("pruning input keys", "err", err)
	} else if len(keys) > 0 {
		c.log.Info("pruned input keys", "removed", len(keys))
	}
}

// expireCancels cancels the modules of cancelled plans whose holders have
// not reported within Config.CancelWait. It reports whether any changed.
func (c *Controller) expireCancels(now time.Time) bool {
	changed := false
	for _, st := range c.plans {
		if mods := st.ExpireCancelling(now, c.cfg.CancelWait); len(mods) > 0 {
			c.log.Warn("cancelled without word from their holders", "plan", st.Plan, "modules", mods, "after", c.cfg.CancelWait)
			c.touch(st, mods...)
			changed = true
		}
	}
	return changed
}

func (c *Controller) observe() {
	by := map[string]int{}
	blocked := 0
	var mods Counts
	for _, st := range c.plans {
		by[string(st.Outcome())]++
		n := st.Counts()
		blocked += n.Blocked
		mods = mods.add(n)
	}
	c.obs.Plans(by, blocked)
	if mo, ok := c.obs.(ModulesObserver); ok {
		mo.Modules(mods.ByState())
	}
	if fo, ok := c.obs.(ForecastObserver); ok {
		now := time.Now().UTC()
		left := map[string]time.Duration{}
		for id, st := range c.plans {
			if st.Outcome() == OutcomeRunning {
				left[id] = st.Forecast(c.lastBuild, now, c.platforms.holders).Remaining
			}
		}
		fo.PlansRemaining(left)
	}
}

// planWindow is the window a plan's state gets: with WindowIdle, 1 between
// flushes while the plan runs alone (a released ask goes out at once when
// the plan has none queued), else -1 (every released ask held for the
// scheduler); widened at each flush to what the scheduler gives it.
func (c *Controller) planWindow() int {
	if c.cfg.Window == WindowIdle {
		if c.alone() {
			return 1
		}
		return -1
	}
	return c.cfg.Window
}

// fillIdle publishes as many held asks as holders are waiting for work,
// as the scheduler shares them across plans (schedule, see Allot). It
// reports whether asks are still held.
func (c *Controller) fillIdle(ctx context.Context) bool { return c.schedule(ctx) }

// idleHolders is how many holders of the build seat wait for an ask now,
// less the asks already queued for them: summed over the holders'
// consumers of every platform.
func (c *Controller) idleHolders(ctx context.Context) (int, error) {
	idle := 0
	for _, p := range c.catPlatforms {
		info, err := c.platformInfo(ctx, p)
		if err != nil {
			return 0, err
		}
		idle += max(0, info.NumWaiting-int(info.NumPending))
	}
	return idle, nil
}

// platformInfo reads the build seat's holders' consumer of a platform.
func (c *Controller) platformInfo(ctx context.Context, platform string) (*jetstream.ConsumerInfo, error) {
	cons := c.seatConsumers[platform]
	if cons == nil {
		var err error
		if cons, err = c.js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(platform)); err != nil {
			return nil, err
		}
		c.seatConsumers[platform] = cons
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return cons.Info(ictx)
}
