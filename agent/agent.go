package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
)

// Agent is a holder of the build seat: each of its slots pulls one ask at a
// time from the seat's one shared consumer, works it, reports and settles it,
// and pulls the next once it has settled — or, with Config.Overlap, once its
// build's own steps are done, the export going on beside the next build.
type Agent struct {
	cfg    Config
	js     jetstream.JetStream
	nc     *nats.Conn
	worker Worker
	log    *slog.Logger
	obs    Observer

	// beat is how often a slot heartbeats its ask (heartbeatEvery), set
	// when Run binds the consumer.
	beat time.Duration
	// lease is how long an ask's claim lives unrenewed (claimLease), set
	// when Run binds the consumer.
	lease time.Duration

	inFlight atomic.Int64
	builtN   atomic.Int64
	failedN  atomic.Int64
	started  time.Time
	running  running
	hand     inHand
	health   health
	// claims are the seat's ask claims as this machine sees them; nil when
	// the bucket is not raised.
	claims *claim.Asks
	// nonce makes this agent's event ids its own (reportAside).
	nonce string
	// trouble is when this agent last saw the bus fail (monotonic, from
	// started); deferred are the asks it has left to a holder whose claim
	// lapsed in such a time, since when (lapsedHolder).
	trouble atomic.Int64
	// reconnects is the connection's reconnect count last looked at
	// (noteReconnects): one more is the bus seen failing.
	reconnects atomic.Uint64
	deferMu    sync.Mutex
	deferred   map[string]time.Time
	// bound are the consumers bound, set by Run.
	bound atomic.Pointer[bound]
	// backPause is until when (monotonic, from started) hand-backs are
	// not announced, and backMisses how many in a row were not
	// (tellHandedBack).
	backPause, backMisses atomic.Int64
	// coolUntil is until when (monotonic, from started) the slots do not
	// pull: a retry this machine gave back is left to an idle machine
	// (coolOff).
	coolUntil atomic.Int64
	// failRun is how many asks in a row the machine has given back to be
	// retried, since its last built (coolOff).
	failRun atomic.Int64
	// idle is whether another machine's pull waited on the queue when
	// asked at idleAt (othersIdle).
	idleMu sync.Mutex
	idle   bool
	idleAt time.Time
}

// New returns an agent from a validated config and its dependencies. A nil
// logger discards; a nil observer observes nothing. Its platforms are
// normalised; with none it builds mesh.DefaultPlatform (RunAgent sets them
// from BuildKit).
func New(cfg Config, js jetstream.JetStream, worker Worker, log *slog.Logger, obs Observer) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if js == nil || worker == nil {
		return nil, fmt.Errorf("%w: a JetStream handle and a worker are required", ErrConfig)
	}
	if len(cfg.Platforms) == 0 {
		cfg.Platforms = []string{mesh.DefaultPlatform}
	}
	var ps []string
	for _, p := range cfg.Platforms {
		n, _ := mesh.NormalizePlatform(p) // Validate checked it
		if !slices.Contains(ps, n) {
			ps = append(ps, n)
		}
	}
	cfg.Platforms = ps
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if obs == nil {
		obs = nopObserver{}
	}
	a := &Agent{cfg: cfg, js: js, nc: js.Conn(), worker: worker, log: log, obs: obs, started: time.Now(), nonce: rand.Text()[:16],
		deferred: map[string]time.Time{}}
	a.reconnects.Store(a.nc.Stats().Reconnects)
	return a, nil
}

// Run works asks until ctx is done. Then it stops fetching, lets the builds
// in hand finish within the grace period, and hands back (Nak) any ask still
// unfinished so another machine takes it at once. A ctx ended by its seat's
// claim lapsing (a bus outage longer than the seat's lease) with
// Config.Stopping set is not a stop: the builds in hand go on to their end,
// however long, and Run returns when they have (the seat is taken back
// after); the grace counts from Stopping if the process stops meanwhile.
// A build that outlives its ask's claim is announced only if nobody took
// the ask since (see work).
func (a *Agent) Run(ctx context.Context) error {
	cons, err := a.bind(ctx)
	if err != nil {
		return err
	}
	a.bound.Store(cons)
	ackWait := cons.first().CachedInfo().Config.AckWait
	a.beat = heartbeatEvery(a.cfg.Heartbeat, ackWait)
	a.lease = claimLease(a.cfg.ClaimLease, ackWait)
	a.claims = a.askClaims(ctx)
	if a.claims != nil && a.cfg.Succeeds != "" && a.cfg.Succeeds != a.cfg.SeatToken {
		go a.handBackLeft(ctx)
	}
	status, err := a.serveStatus()
	if err != nil {
		return err
	}
	defer status.Unsubscribe()
	cancelSub, err := a.serveCancel()
	if err != nil {
		return err
	}
	defer cancelSub.Unsubscribe()
	// The tools are served (the server has the subscriptions) before the
	// first probe or pull, so that what they do can be asked about.
	if err := a.nc.Flush(); err != nil {
		return fmt.Errorf("serving the seat's tools: %w", err)
	}
	a.log.Info("holding the build seat", "machine", a.cfg.Machine, "slots", a.cfg.Slots, "heartbeat", a.beat, "claim lease", a.lease,
		"platforms", a.cfg.Platforms, "consumers", cons.names())

	// work outlives ctx by the grace period.
	work, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelWork(nil)
	stopGrace := context.AfterFunc(ctx, func() {
		if stop := a.cfg.Stopping; stop != nil && errors.Is(context.Cause(ctx), claim.ErrLapsed) {
			a.log.Warn("the seat's claim lapsed (the bus did not answer): no new asks; the builds in hand go on to their end, then the seat is taken back",
				"in_hand", a.inFlight.Load())
			select {
			case <-stop.Done():
			case <-work.Done():
				return
			}
		}
		a.log.Info("stopping: no new asks; builds in hand may finish", "grace", a.cfg.Grace)
		t := time.NewTimer(a.cfg.Grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancelWork(ErrStopped)
		case <-work.Done():
		}
	})
	defer stopGrace()

	var wg sync.WaitGroup
	for slot := range a.cfg.Slots {
		wg.Go(func() { a.slot(ctx, work, cons, slot) })
	}
	wg.Wait()
	return nil
}

// bindRetry is how bind waits to ask again after a try the server did not
// answer in time.
var bindRetry = backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second}

// bindWait bounds each try's wait for the server's answer, growing with
// the tries: a fleet starting at once fills the server's JetStream API
// queue, and each consumer's info the server answers walks every pull
// waiting on it, so it answers late, not never. A try given up on stays in
// the server's queue: asking again every 5 s (nats.go's default) only adds
// to the queue it waits in (at 10,000 machines the server dropped its
// queue's 10,000 requests, then kept dropping the retries).
var bindWait = backoff.Policy{First: 5 * time.Second, Max: time.Minute}

// raiseWait is how often a machine asks again for a platform's consumer
// the controller has not raised: its FetchWait (at least 5 s), so that a
// fleet's asks cost its server what its idle pulls do (mesh.FleetSettingsOf)
// — 10,000 machines of four platforms, one raised, asking every 5 s would
// make 6,000 requests a second.
func (a *Agent) raiseWait() time.Duration { return max(mesh.MinFetchWait, a.cfg.FetchWait) }

// bound are the holders' consumers of the agent's platforms that it has
// bound; a platform whose consumer is not raised yet joins when it is.
type bound struct {
	mu        sync.Mutex
	cons      []jetstream.Consumer
	platforms []string // of each consumer
	// shards is how many shards each consumer's platform queue has, and
	// own the one the consumer is (mesh.ShardOf); steals are the other
	// shards' consumers bound to take from (stealFrom), by name.
	shards, own, stole []int
	steals             map[string]jetstream.Consumer
}

func (b *bound) add(platform string, c jetstream.Consumer, machine string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cons = append(b.cons, c)
	b.platforms = append(b.platforms, platform)
	n := mesh.ShardsOfMetadata(c.CachedInfo().Config.Metadata)
	b.shards = append(b.shards, n)
	b.own = append(b.own, mesh.ShardOf(machine, n))
	b.stole = append(b.stole, 0)
}

func (b *bound) all() []jetstream.Consumer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.cons)
}

// held are the platforms whose queues are bound, sorted.
func (b *bound) held() []string {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out := slices.Clone(b.platforms)
	slices.Sort(out)
	return out
}

func (b *bound) first() jetstream.Consumer { return b.all()[0] }

// at is the consumer bound turn-th, in turn, and its platform; ok is false
// while none is bound.
func (b *bound) at(turn int) (_ jetstream.Consumer, platform string, ok bool) {
	if b == nil {
		return nil, "", false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.cons) == 0 {
		return nil, "", false
	}
	i := turn % len(b.cons)
	return b.cons[i], b.platforms[i], true
}

func (b *bound) names() []string {
	var out []string
	for _, c := range b.all() {
		out = append(out, c.CachedInfo().Name)
	}
	return out
}

// bind binds the build seat's holders' consumer of each of the agent's
// platforms (mesh.BuildConsumer), and only those: an ask for another
// platform is never delivered here. The platforms are bound at once, each
// on its own, and bind returns as soon as one is bound: a platform whose
// queue this principal may not reach (no grant: the server answers a
// permission violation only in the connection's error stream, so the
// request waits out its timeout) does not delay the others, and takes no
// asks. A platform whose consumer is not raised yet (no module of the
// catalogue is built for it) is bound in the background when it appears;
// bind waits for the controller's raise if none is there yet. It fails
// when no platform can be bound.
func (a *Agent) bind(ctx context.Context) (*bound, error) {
	b := &bound{}
	stream := mesh.SeatStream(mesh.BuildSeat)
	ready := make(chan struct{})
	var once sync.Once
	firsts := make(chan bindFirst, len(a.cfg.Platforms))
	for _, p := range a.cfg.Platforms {
		go func() {
			if cons, ok := a.bindPlatform(ctx, p, firsts, func() bool { return len(b.all()) > 0 }); ok {
				b.add(p, cons, a.cfg.Machine)
				once.Do(func() { close(ready) })
			}
		}()
	}
	var failed []string
	var errs []error
	for range a.cfg.Platforms {
		select {
		case f := <-firsts:
			if f.err != nil && !bindLater(f.err) {
				failed = append(failed, f.platform)
				errs = append(errs, fmt.Errorf("binding consumer %s/%s: %w", stream, mesh.BuildConsumer(f.platform), f.err))
			}
		case <-ready:
			return b, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	switch {
	case len(failed) == 1 && len(a.cfg.Platforms) == 1:
		return nil, errs[0]
	case len(failed) == len(a.cfg.Platforms):
		return nil, fmt.Errorf("binding the build seat's consumers of %v: none could be bound: %w", failed, errors.Join(errs...))
	}
	select {
	case <-ready:
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// bindFirst is how a platform's first try at binding went: err nil, bound;
// notRaised, waiting for the raise.
type bindFirst struct {
	platform string
	err      error
}

// bindLater reports whether binding a consumer is worth trying again
// after err: it is not raised yet, or the server did not answer in time
// (a fleet starting at once, mesh.Unanswered).
func bindLater(err error) bool { return notRaised(err) || mesh.Unanswered(err) }

// notRaised reports whether err says a consumer (or its stream) is not
// raised yet.
func notRaised(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// bindPlatform binds platform p's consumer of the build seat, telling
// firsts how its first try went; a consumer not raised yet is waited for
// (anyBound says whether another platform's is bound already). It reports
// false when p is not bound (said in the log).
func (a *Agent) bindPlatform(ctx context.Context, p string, firsts chan<- bindFirst, anyBound func() bool) (jetstream.Consumer, bool) {
	stream := mesh.SeatStream(mesh.BuildSeat)
	name := mesh.BuildConsumer(p)
	try := func(n int) (jetstream.Consumer, error) {
		tctx, cancel := context.WithTimeout(ctx, bindWait.Delay(n))
		defer cancel()
		cons, err := a.js.Consumer(tctx, stream, mesh.BuildConsumer(p))
		if err == nil {
			// A platform whose queue has shards says how many on its
			// consumer (shard 0); this machine pulls from its own.
			shards := mesh.ShardsOfMetadata(cons.CachedInfo().Config.Metadata)
			if k := mesh.ShardOf(a.cfg.Machine, shards); k > 0 {
				name = mesh.BuildShardConsumer(p, k)
				if cons, err = a.js.Consumer(tctx, stream, name); err != nil && !notRaised(err) {
					// Credentials issued before the seat had shards
					// grant shard 0 only: the server then answers
					// nothing (a permission violation).
					err = fmt.Errorf("this machine's shard %d of %d: %w (credentials grant the shards of the catalogue they were issued from: after changing the seat's shards, issue them again)", k, shards, err)
				}
			}
		}
		if err == nil {
			err = roomFor(cons.CachedInfo(), a.cfg.Slots)
		}
		return cons, err
	}
	cons, err := try(1)
	firsts <- bindFirst{p, err}
	switch {
	case bindLater(err):
		if notRaised(err) {
			a.log.Info("no ask is queued for this platform yet; waiting for the controller to raise its queue", "platform", p, "asking again every", a.raiseWait())
		} else {
			a.log.Info("the server did not answer binding a platform's consumer; trying again (a fleet starting at once needs the server's jetstream request_queue_limit of mesh.FleetSettingsOf)",
				"platform", p, "err", err, "waited", bindWait.Delay(1))
		}
		for n := 1; bindLater(err); n++ {
			// While no platform is bound the machine waits for the
			// controller's raise (at start); once one is, another one's
			// consumer is asked for every raiseWait.
			slow := func() bool { return notRaised(err) && anyBound() }
			wait := bindRetry.Delay(n)
			if slow() {
				wait = a.raiseWait()
			}
			werr := backoff.Wait(ctx, wait)
			if werr == nil && slow() && wait < a.raiseWait() {
				werr = backoff.Wait(ctx, a.raiseWait()-wait)
			}
			if werr != nil {
				err = werr
				break
			}
			cons, err = try(n + 1)
		}
		if err != nil {
			switch {
			case errors.Is(err, ErrNoRoom):
				a.log.Error("refusing a platform's consumer: no room for this machine's pulls", "platform", p, "consumer", stream+"/"+name, "err", err)
			case ctx.Err() == nil:
				a.log.Warn("binding a platform's consumer", "platform", p, "consumer", stream+"/"+name, "err", err)
			}
			return nil, false
		}
		a.log.Info("bound a platform's consumer", "platform", p, "consumer", stream+"/"+name)
	case err != nil:
		if ctx.Err() == nil && len(a.cfg.Platforms) > 1 {
			a.log.Warn("cannot bind a platform's consumer; taking no asks for it", "platform", p,
				"consumer", stream+"/"+name, "err", err)
		}
		return nil, false
	}
	return cons, true
}

// slot pulls one ask at a time until ctx is done, from the consumers of
// the agent's platforms in turn: one pull at a time, and the next only once
// the last build's steps are done (handOver), so that the slot never holds
// two asks to build and never hands one back for being busy. With one
// platform each pull waits FetchWait; with several, FetchWait shared among
// them, so an idle slot asks every platform within FetchWait.
func (a *Agent) slot(ctx, work context.Context, b *bound, slot int) {
	idle := time.Now() // since the slot last settled an ask
	// tail is closed when the slot's last build has settled; nil once it
	// has (handOver: it may be exporting beside the next one).
	var tail <-chan struct{}
	defer func() {
		if tail != nil {
			<-tail
		}
	}()
	for turn := 0; ctx.Err() == nil; turn++ {
		if !a.awaitHealthy(ctx, work) || !a.awaitCooled(ctx) {
			continue // stopping
		}
		a.noteReconnects()
		all := b.all()
		cons := all[turn%len(all)]
		wait := max(a.cfg.FetchWait/time.Duration(len(all)), minFetchWait)
		opts, done := pullOpts(ctx, wait)
		batch, err := cons.Fetch(1, opts...)
		if err != nil {
			done()
			a.troubled()
			a.log.Warn("fetch failed", "slot", slot, "err", err)
			_ = backoff.Wait(ctx, time.Second)
			continue
		}
		take := func(batch jetstream.MessageBatch) bool {
			got := false
			for msg := range batch.Messages() {
				if ctx.Err() != nil {
					// Stopping: an ask that arrived now goes straight back.
					_ = msg.Nak()
					continue
				}
				a.obs.IdleWaited(time.Since(idle))
				tail = a.handOver(work, msg, tail)
				idle = time.Now()
				got = true
			}
			return got
		}
		if take(batch) {
			turn-- // the same platform again: it may have more
		} else if other := a.stealFrom(ctx, b, turn); other != nil && ctx.Err() == nil {
			// Nothing in this machine's shard: an ask left in another.
			if left, err := other.FetchNoWait(1); err == nil && take(left) {
				turn--
			}
		}
		done()
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			a.troubled()
			if exceededMaxWaiting(err) {
				a.log.Error("fetch refused: the seat's consumer's MaxWaiting is below the fleet's machines × slots × 1.25 (mesh.FleetSettingsOf); machines sit idle",
					"slot", slot, "err", err)
			} else {
				a.log.Warn("fetch ended", "slot", slot, "err", err)
			}
			_ = backoff.Wait(ctx, time.Second)
		}
	}
}

// ErrNoRoom is an agent refusing to hold the seat: the holders' consumer
// has no room for its slots' pulls, which the server would drop.
var ErrNoRoom = errors.New("the seat's consumer has no room for this machine's pulls")

// roomFor checks that the holders' consumer described by info keeps a pull
// of each of slots waiting beside those already waiting: beyond its
// MaxWaiting the server drops a pull (a Fetch hears "409 Exceeded
// MaxWaiting"; a Consume nothing), and the machine would sit idle.
func roomFor(info *jetstream.ConsumerInfo, slots int) error {
	mw := info.Config.MaxWaiting
	if mw <= 0 || info.NumWaiting+slots <= mw {
		return nil
	}
	return fmt.Errorf("%w: consumer %s/%s has MaxWaiting %d with %d pulls waiting, %d slots more would be dropped; "+
		"a fleet of M machines of S slots needs MaxWaiting ≥ 1.25 × M × S (mesh.FleetSettingsOf): delete the consumer while no holder works and raise the catalogue again",
		ErrNoRoom, info.Stream, info.Name, mw, info.NumWaiting, slots)
}

// exceededMaxWaiting reports whether err is the server's "409 Exceeded
// MaxWaiting" to a pull (nats.go has no error value for it).
func exceededMaxWaiting(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Exceeded MaxWaiting")
}

// pullOpts are the options of a pull that waits wait, and what ends it.
// A pull of 10 s or more is also heard from (PullHeartbeat), where nats.go
// would have the server send a heartbeat every 5 s whatever the wait — at
// 10,000 machines 2,000 a second, each a walk of every waiting pull
// (mesh.FleetSettingsOf) — and it ends when ctx does: a stopping agent
// does not wait out a long pull (the server delivers nothing to a pull
// whose inbox is gone). A shorter one ends by itself soon enough.
func pullOpts(ctx context.Context, wait time.Duration) ([]jetstream.FetchOpt, context.CancelFunc) {
	hb := PullHeartbeat(wait)
	if hb == 0 {
		return []jetstream.FetchOpt{jetstream.FetchMaxWait(wait)}, func() {}
	}
	// nats.go asks the server for the context's time less a second.
	fctx, cancel := context.WithTimeout(ctx, wait)
	return []jetstream.FetchOpt{jetstream.FetchContext(fctx), jetstream.FetchHeartbeat(hb)}, cancel
}

// PullHeartbeat is how often the server tells a pull that waits wait that
// it still holds it: from 10 s on, a second less than half the wait (nats.go
// asks the server for the wait less up to a second, and refuses a
// heartbeat of more than half of that), so that a pull is heard from about
// half way and one lost to a reconnect is noticed within the wait; none
// for a shorter one (it is renewed soon enough).
func PullHeartbeat(wait time.Duration) time.Duration {
	if wait < 10*time.Second {
		return 0
	}
	return wait/2 - time.Second
}

// minFetchWait is the shortest pull a slot waits on one platform.
const minFetchWait = 100 * time.Millisecond

// Status is what an agent answers to the seat's status tool.
type Status struct {
	Machine  string `json:"machine"`
	Slots    int    `json:"slots"`
	InFlight int64  `json:"in_flight"`
	Built    int64  `json:"built"`
	Failed   int64  `json:"failed"`
	// Platforms are those whose queues the agent holds: the asks it takes.
	Platforms []string `json:"platforms"`
	// Builds are every platform it would take asks for: its BuildKit
	// worker's, narrowed by --platforms or the catalogue. Of these, a
	// platform with no queue yet, or none it may bind, is not in Platforms.
	Builds []string `json:"builds,omitempty"`
	// Health is HealthHealthy, or HealthUnhealthy while the machine cannot
	// build (its BuildKit does not answer): it takes no asks then. Why
	// says what its probe found, since when.
	Health      string    `json:"health"`
	Why         string    `json:"why,omitempty"`
	HealthSince time.Time `json:"health_since,omitzero"`
	Since       time.Time `json:"since"`
	At          time.Time `json:"at"`
}

// The health of a machine, as Status says it.
const (
	HealthHealthy   = "healthy"
	HealthUnhealthy = "unhealthy"
)

// Status reports the agent's counters now.
func (a *Agent) Status() Status {
	st := Status{
		Machine: a.cfg.Machine, Slots: a.cfg.Slots, InFlight: a.inFlight.Load(),
		Built: a.builtN.Load(), Failed: a.failedN.Load(), Platforms: a.bound.Load().held(), Builds: a.cfg.Platforms,
		Health: HealthHealthy, Since: a.started.UTC(), At: time.Now().UTC(),
	}
	if why, since := a.health.state(); why != "" {
		st.Health, st.Why, st.HealthSince = HealthUnhealthy, why, since.UTC()
	}
	return st
}

// StatusTool is the tool every holder of the build seat serves: a request
// on it is answered by every agent online (scatter-gather).
const StatusTool = mesh.StatusTool

// statusAsk is a request on the status tool: its nonce tells the answers
// to it from those to other requests.
type statusAsk struct {
	Nonce string `json:"nonce"`
}

// statusAnswer is a holder's answer, published on its own
// mesh.HolderStatusSubject: the subject names the machine.
type statusAnswer struct {
	Nonce  string `json:"nonce"`
	Status Status `json:"status"`
}

func (a *Agent) serveStatus() (*nats.Subscription, error) {
	subj := mesh.SeatToolSubject(mesh.BuildSeat, StatusTool)
	answer := mesh.HolderStatusSubject(mesh.BuildSeat, a.cfg.Machine)
	sub, err := a.nc.Subscribe(subj, func(m *nats.Msg) {
		var req statusAsk
		if json.Unmarshal(m.Data, &req) != nil || req.Nonce == "" {
			a.log.Debug("ignoring a status request with no nonce")
			return
		}
		data, _ := json.Marshal(statusAnswer{Nonce: req.Nonce, Status: a.Status()})
		_ = a.nc.Publish(answer, data)
	})
	if err != nil {
		return nil, fmt.Errorf("serving %s: %w", subj, err)
	}
	return sub, nil
}

// serveCancel answers the seat's cancel tool: the asks named that this agent
// is working on are cut short, failed{cancelled} and settled.
func (a *Agent) serveCancel() (*nats.Subscription, error) {
	subj := mesh.SeatToolSubject(mesh.BuildSeat, mesh.CancelTool)
	sub, err := a.nc.Subscribe(subj, func(m *nats.Msg) {
		var req mesh.Cancel
		if err := json.Unmarshal(m.Data, &req); err != nil {
			a.log.Warn("refusing a malformed cancel", "err", err)
			return
		}
		var mine []string
		for _, id := range req.Asks {
			if a.Cancel(id) {
				mine = append(mine, id)
			}
		}
		if len(mine) > 0 {
			a.log.Info("cancelled", "asks", mine)
		}
		if m.Reply != "" {
			data, _ := json.Marshal(mesh.Cancel{Asks: mine})
			_ = m.Respond(data)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("serving %s: %w", subj, err)
	}
	return sub, nil
}

// publishLog publishes one batch of a build's output on log.<ask>. Logs
// are best effort: a core publish, kept by the LOGS stream.
func (a *Agent) publishLog(b mesh.LogBatch) {
	b.On = a.cfg.Machine
	data, err := json.Marshal(b)
	if err != nil {
		return
	}
	if err := a.nc.Publish(mesh.HolderEventSubject(mesh.BuildSeat, a.cfg.Machine, mesh.LogEvent(b.Ask)), data); err != nil {
		a.log.Warn("publishing build output", "ask", b.Ask, "err", err)
	}
}

func oneLine(err error) string {
	s := err.Error()
	for i, r := range s {
		if r == '\n' {
			s = s[:i]
			break
		}
	}
	if len(s) > 500 {
		s = s[:500] + "…"
	}
	return s
}

// AskStatus asks every agent online for its status and collects the answers
// that arrive within wait. Each answer is taken from its machine's own
// subject (mesh.HolderStatusSubject), so one machine cannot answer for
// another: an answer naming another machine than its subject is dropped.
func AskStatus(ctx context.Context, nc *nats.Conn, wait time.Duration) ([]Status, error) {
	var out []Status
	err := gatherStatus(ctx, nc, wait, func(st Status) bool {
		out = append(out, st)
		return false
	})
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Machine, b.Machine) })
	return out, err
}

// gatherStatus asks every holder of the build seat for its status and
// gives each answer that arrives within wait to seen, until seen returns
// true.
func gatherStatus(ctx context.Context, nc *nats.Conn, wait time.Duration, seen func(Status) bool) error {
	sub, err := nc.SubscribeSync(mesh.HolderStatusSubject(mesh.BuildSeat, mesh.AnyHolder))
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	nonce := rand.Text()
	req, _ := json.Marshal(statusAsk{Nonce: nonce})
	if err := nc.Publish(mesh.SeatToolSubject(mesh.BuildSeat, StatusTool), req); err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return nil
		}
		m, err := sub.NextMsg(left)
		if err != nil {
			return nil
		}
		machine, ok := mesh.HolderOfStatusSubject(mesh.BuildSeat, m.Subject)
		var ans statusAnswer
		if !ok || json.Unmarshal(m.Data, &ans) != nil || ans.Nonce != nonce || ans.Status.Machine != machine {
			continue
		}
		if seen(ans.Status) {
			return nil
		}
	}
}
