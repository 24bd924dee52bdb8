package cascade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
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
	// seatHeld says whether the controller still holds its seat (SetHeld).
	seatHeld claim.Holding
	js       jetstream.JetStream
	nc       *nats.Conn
	log      *slog.Logger
	obs      Observer
	module   string

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
	// seatConsumers are the build seat's holders' consumers, by name.
	seatConsumers map[string]jetstream.Consumer
	// shardViews are the looks at each platform's shards (shardFor).
	shardViews map[string]*shardView
	// askShard is the shard each ask was published to (with askSeq).
	askShard map[string]int
	// shardAdvised is the most shards advised for each platform.
	shardAdvised map[string]int
	// events is the controller's own consumer of the events stream (read
	// by caughtUp); eventsSeen is the latest stream sequence of an event
	// worked; behind is what schedule holds its hand-out for (nil: none).
	events     jetstream.Consumer
	eventsSeen uint64
	behind     *eventMark
	// floor is the events floor (floor.go).
	floor floorKeeper
	// askPlatform is the platform of each ask published (with askSeq).
	askPlatform map[string]string
	// platforms is what the controller saw of each platform's holders.
	platforms platformWatch
	// asks is the build seat's ask claims bucket the fence reads; nil
	// until Run opens it.
	asks jetstream.KeyValue
	// seatClaims is the mesh's bucket of seat claims, which an ask claim
	// is bound to (claim.Bound); nil when it cannot be opened.
	seatClaims jetstream.KeyValue
	// askKey derives every ask's secret (askSecret); set by Run.
	askKey []byte
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
	// replans are the plans to plan again as Run starts (Replan).
	replans []Replan
	// sched is the scheduling across plans (scheduler.go).
	sched scheduler

	// fetching are the pushes set aside while a commit of their repository
	// is fetched beside the loop, by repository, in order (prefetch.go);
	// fetched says a fetch is done; fetchFailed are the commits whose
	// fetch failed, not fetched again while their pushes are planned.
	fetching    map[string][]jetstream.Msg
	fetched     chan prefetched
	fetchFailed map[fetchSource]error
	// fetchedNow is the commit whose fetch afterFetch works the pushes
	// of: never set aside for it again.
	fetchedNow fetchSource
	// heads are the HEADs of the repositories fetched beside the loop for
	// the pushes afterFetch works: their modules are addressed at them.
	heads map[string]string

	// owed are the modules still waiting that a flush left unstored, by
	// key (someWaiting); spared is when the last share of them was stored;
	// sharing is the share being stored beside the loop (storeShare), nil
	// when none is, and writeShare what stores it (nil: the store's Put).
	owed       map[string]any
	spared     time.Time
	sharing    *shareWrite
	writeShare func(context.Context, map[string]any) error
	// busySinceShare is whether the loop worked events since the last
	// share was taken (spareIn).
	busySinceShare bool

	// a batch's pending effects
	dirty    map[string]any
	dirtyRun map[string]bool
	submits  []Submit
	// later are the modules whose started waits to be stored with their
	// next change, by key (startedwrite.go).
	later map[string]*laterWrite
	// replaying: the events worked are replay's (resume.go), not the
	// consumer's.
	replaying bool
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
		fetched: make(chan prefetched, 16),
		keys:    map[string]KeyRecord{}, trees: treeCache(cfg),
		seatConsumers: map[string]jetstream.Consumer{}, askPlatform: map[string]string{},
		shardViews: map[string]*shardView{}, askShard: map[string]int{}, shardAdvised: map[string]int{},
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

// lostSeat reports whether the controller no longer holds its seat, and
// logs that what would have been done is not. Every write of the plan
// store checks it (Store.Held), and so does every publish of asks; so must
// what the controller does beside them: push an image index and tag it
// latest (assemble), delete a cancelled or given-up ask from the queue,
// ask the holders to cancel. A controller that wakes after its seat was
// taken (stopped with SIGSTOP, cut off) runs one turn before it sees it
// lost at the flush, and that turn's tick pushed the indexes of the plans
// it knew: latest moved back to an index the holder had replaced.
func (c *Controller) lostSeat(what string) bool {
	err := c.seatHeld.Err()
	if err != nil {
		c.log.Warn("not done: this controller no longer holds its seat", "what", what, "err", err)
	}
	return err != nil
}

// SetHeld sets what says whether this controller still holds its seat
// (claim.Lease.Held); call it before Run. It is asked before every write
// to the plan store, every round of asks published and every batch of
// events acknowledged: a controller that stood still (stopped by hand) for
// longer than its lease wakes with its work runnable as soon as the
// goroutine that renews its claim, and without it a write sent before the
// claim's loss cancelled its context would land on the state of the
// standby that has the seat by then.
func (c *Controller) SetHeld(held func() error) { c.seatHeld = held }

// controllerModule finds the catalogue module the controller runs as.
func controllerModule(cat *mesh.Catalogue, name string) (string, error) {
	if m, ok := seat.ControllerModule(cat, name, StateBucket); ok {
		return m, nil
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
func (c *Controller) raise(ctx context.Context, cat *mesh.Catalogue) (r mesh.RaiseReport, err error) {
	err = c.answered(ctx, "raising the catalogue", func() error {
		r, err = mesh.Raise(ctx, c.js, cat, c.cfg.Replicas)
		return err
	})
	return r, err
}

// answered calls fn again, with backoff and saying so in the log, while
// what it returns is the bus not answering in time (unanswered): a
// controller that starts while the bus is away, or a cluster elects its
// leaders, waits for it instead of stopping. Any other error is returned at
// once; fn's last error when ctx ends.
func (c *Controller) answered(ctx context.Context, what string, fn func() error) error {
	return mesh.Answered(ctx, c.log, what, fn)
}

// unanswered reports whether err is the bus not answering in time, not a
// refusal (mesh.Unanswered).
func unanswered(err error) bool { return mesh.Unanswered(err) }

// Run raises the catalogue, resumes the plans in the store and works until
// ctx is done: each turn of its loop is one batch (see the package doc's
// batch loop).
func (c *Controller) Run(ctx context.Context) error {
	// Given back once the consumer stopped: else the server would deliver
	// them again to its last pull at once.
	defer c.giveBackLater()
	in, err := c.start(ctx)
	if err != nil {
		return err
	}
	defer in.stop()
	// A share of the modules still waiting is not left writing behind a
	// controller that stopped.
	defer c.awaitShare()
	c.log.Info("controller running", "module", c.module, "plans", len(c.plans))

	tick := time.NewTicker(c.cfg.ObserveEvery)
	defer tick.Stop()
	for {
		var batch []jetstream.Msg
		var look, forecast, later <-chan time.Time
		if c.held {
			look = time.After(c.cfg.IdleLook)
		}
		if len(c.owed) > 0 && c.sharing == nil {
			// Modules still waiting to be stored (someWaiting): their
			// next share, a turn of its own if no event comes first.
			if wait := c.spareIn(); wait == 0 {
				look = closedLook
			} else if look == nil {
				look = time.After(wait)
			}
		}
		if due, ok := c.forecastDue(); ok {
			forecast = time.After(time.Until(due))
		}
		if due, ok := c.laterDue(); ok {
			later = time.After(time.Until(due))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-look:
		case now := <-later:
			// Starteds whose module did not change since: stored now.
			c.writeDue(now)
		case <-forecast:
			// Records written with an older forecast get a fresh one.
			for id := range c.forecastOwed {
				if st := c.plans[id]; st != nil {
					c.touch(st)
				}
				delete(c.forecastOwed, id)
			}
		case err := <-c.shareDone():
			c.shareStored(err)
		case m, ok := <-in.events:
			if !ok {
				return errors.New("the event consumer stopped")
			}
			batch = c.work(ctx, m, in.events)
		case cmd := <-c.cmds:
			if c.lostSeat("answering a tool") {
				cmd.Answer(Reply{Error: fmt.Sprintf("this controller no longer holds %s; ask again: the holder answers", mesh.ControllerSeat)})
				return nil
			}
			if !c.rebuildAside(ctx, cmd) {
				cmd.Answer(c.command(ctx, cmd.Q))
			}
		case d := <-c.fetched:
			batch = c.afterFetch(ctx, d)
		case m, ok := <-in.gaveUp:
			if !ok {
				return errors.New("the consumer of given-up asks stopped")
			}
			c.abandoned(ctx, m.Data(), time.Now().UTC())
			// Acknowledged with the batch, once the failure is stored.
			batch = append(batch, m)
		case <-tick.C:
			if !c.tick(ctx) {
				continue
			}
		}
		if err := c.flush(ctx); err != nil {
			return err
		}
		if ctx.Err() != nil || c.seatHeld.Err() != nil {
			// Stopped (or lost mesh-controller) mid-batch: its state may be
			// unwritten, so its events stay unacked for the next holder.
			return nil
		}
		for _, m := range batch {
			_ = m.Ack()
		}
		c.ackWritten()
	}
}

// runInputs are the consumers and tool subscriptions Run waits on, and how
// to stop them (in the reverse of the order they were started).
type runInputs struct {
	events, gaveUp <-chan jetstream.Msg
	stops          []func()
}

func (in *runInputs) stop() {
	for i := len(in.stops) - 1; i >= 0; i-- {
		in.stops[i]()
	}
}

// start raises the catalogue, opens the plan store and the ask claims,
// resumes the stored plans, then serves the tools and consumes the events
// and the asks the server gave up on.
func (c *Controller) start(ctx context.Context) (*runInputs, error) {
	r, err := c.raise(ctx, c.cat)
	if err != nil {
		return nil, err
	}
	c.logRaise(r)
	// Each step below waits for a bus that does not answer (answered),
	// as the raise does: a controller started in an outage, or taking its
	// seat over as the bus comes back, works once it answers.
	if err := c.answered(ctx, "opening the plan store", func() (err error) {
		c.store, err = OpenStore(ctx, c.js, c.module)
		if err == nil {
			c.store.Held = c.seatHeld
		}
		return err
	}); err != nil {
		return nil, err
	}
	if err := c.answered(ctx, "reading the asks' key", func() (err error) {
		c.askKey, err = c.store.AskKey(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	if err := c.answered(ctx, "opening the ask claims", func() (err error) {
		c.asks, err = c.js.KeyValue(ctx, mesh.AskClaimsBucket(mesh.BuildSeat))
		return err
	}); err != nil {
		// Raised above with the catalogue; a catalogue without the build
		// seat has no outcomes to fence.
		c.log.Warn("no ask claims bucket: every outcome of the build seat is refused", "err", err)
		c.asks = nil
	}
	if err := c.answered(ctx, "opening the seat claims", func() (err error) {
		c.seatClaims, err = c.js.KeyValue(ctx, mesh.ClaimsBucket())
		return err
	}); err != nil {
		c.log.Warn("no seat claims bucket: an ask claim is judged on its own lease", "err", err)
		c.seatClaims = nil
	}
	if err := c.answered(ctx, "reading the events floor", func() error { return c.loadFloor(ctx) }); err != nil {
		return nil, err
	}
	c.leadHere(ctx)
	if err := c.resume(ctx); err != nil {
		return nil, err
	}
	c.replan(ctx)
	subs, err := c.serveTools()
	if err != nil {
		return nil, err
	}
	in := &runInputs{stops: []func(){func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}}}
	// The asks the server gave up on, from the stream that kept its
	// advisories while no controller ran as well as now.
	var gaveUp <-chan jetstream.Msg
	var stopGaveUp func()
	if err := c.answered(ctx, "consuming the given-up asks", func() (err error) {
		gaveUp, stopGaveUp, err = c.consumeGaveUp(ctx)
		return err
	}); err != nil {
		in.stop()
		return nil, err
	}
	in.gaveUp, in.stops = gaveUp, append(in.stops, stopGaveUp)
	// On the way out, events fetched and not worked go back at once, so
	// the next holder of mesh-controller has them without an ack wait.
	var events <-chan jetstream.Msg
	var stopEvents func()
	if err := c.answered(ctx, "consuming the events", func() (err error) {
		events, stopEvents, err = c.consume(ctx, mesh.EventsStream, mesh.ModuleConsumer(c.module), c.cfg.Batch, "events")
		return err
	}); err != nil {
		in.stop()
		return nil, err
	}
	in.events, in.stops = events, append(in.stops, stopEvents)
	return in, nil
}

// tick is the controller's periodic look: it observes, and bounds what
// waited too long, notes the platforms no machine serves and pushes the
// image indexes due. It reports whether a flush has anything to do.
func (c *Controller) tick(ctx context.Context) bool {
	c.observe()
	now := time.Now().UTC()
	cancels, expired := c.expireCancels(now), c.expireAsks(now)
	noted := c.watchPlatforms(ctx)
	indexed := c.assemble(ctx, true)
	c.keepFloor(ctx, time.Now())
	return cancels || expired || noted || indexed || c.unflushed()
}

func (c *Controller) logRaise(r mesh.RaiseReport) {
	c.log.Info("raised the catalogue", "created", len(r.Created), "updated", len(r.Updated), "unchanged", len(r.Unchanged))
	for _, o := range r.Orphans {
		c.log.Warn("declaration gone; kept, not deleted", "what", o)
	}
	for _, o := range r.KeptStorage {
		c.log.Info("consumer keeps its state where it was made (the server cannot move it); to have it made as the catalogue says, delete it while no controller runs, once this version has worked events (its events floor stored)", "consumer", o)
	}
	for _, o := range r.Short {
		c.log.Error("holders' consumer too small for the fleet; kept (the server cannot change it): delete it while no holder works and raise again", "what", o)
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
	return seat.SetCatalogue(ctx, c.cmds, cat)
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

// leadHereFor bounds leadHere: on a cluster without quorum nobody answers,
// and the controller starts all the same.
const leadHereFor = 5 * time.Second

// leadHere has the leaders of what the controller writes and reads on
// every step on the server it is connected to (mesh.LeadHere), before it
// resumes its plans: its plans bucket's stream, the build seat's queue it
// publishes the asks on, and its consumer on EVENTS — groups nobody else
// writes to, so that a move, which leaves a group without a leader for a
// moment, holds up no machine's write (EVENTS and the ask claims, which
// every machine writes, stay where they are). On a cluster of
// three with the leaders where they fell, two in three of those writes
// and deliveries crossed a route to a leader on another server and their
// answers crossed back (BenchmarkFleet1000 cluster3, the messages between
// the servers a module). One server, or one replica: nothing to do. What
// it could not move is logged and served where it is.
func (c *Controller) leadHere(ctx context.Context) {
	if c.nc == nil || c.store == nil {
		return
	}
	groups := []mesh.Group{
		{Stream: mesh.KVStream(c.store.KV().Bucket())},
		{Stream: mesh.EventsStream, Consumer: mesh.ModuleConsumer(c.module)},
	}
	if c.asks != nil {
		groups = append(groups, mesh.Group{Stream: mesh.SeatStream(mesh.BuildSeat)})
	}
	ctx, cancel := context.WithTimeout(ctx, leadHereFor)
	defer cancel()
	moved, err := mesh.LeadHere(ctx, c.nc, c.js, groups)
	if len(moved) > 0 {
		c.log.Info("the leaders of what this controller writes are on its server now", "server", c.nc.ConnectedServerName(), "moved", fmt.Sprint(moved))
	}
	if err != nil {
		c.log.Warn("some leaders stay where they are: their writes cross a route", "server", c.nc.ConnectedServerName(), "err", err)
	}
}
