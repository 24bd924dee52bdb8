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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
)

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
			key := ModuleKey(st.Plan, m)
			c.dirty[key] = ms
			c.laterTouched(key)
		}
	}
}

// enqueue keeps submits for the next flush, and records the modules the
// state settled unchanged on the way.
func (c *Controller) enqueue(st *State, subs []Submit) {
	for _, s := range subs {
		if ask, why := c.unbuildable(s); why != "" {
			// Its asks would be refused by the bus (no queue takes the
			// subject, or no holder may), and the flush would retry them
			// while every other plan waited: the module fails instead.
			blocked := st.Failed(mesh.Failed{Plan: st.Plan, Module: s.Module, Ask: ask, Reason: mesh.ReasonAsk, Message: why}, time.Now().UTC())
			c.log.Error("not submitted: the catalogue changed since the plan was made", "plan", st.Plan, "module", s.Module, "why", why)
			c.touch(st, s.Module)
			c.touch(st, blocked...)
			continue
		}
		c.touch(st, s.Module)
		c.submits = append(c.submits, s)
	}
	for _, m := range st.Reused() {
		c.touch(st, m)
		c.setCurrent(st, m)
	}
}

// unbuildable says why the catalogue in use cannot take sub's asks, with
// the ask to fail: its module is no longer in it, or one of its platforms
// is no longer built by any module (the seat's queue has no subject for
// it once the catalogue changed). A plan is made from the catalogue of its
// time; a change made while it runs must not leave it asking for what no
// queue takes. "" when it can.
func (c *Controller) unbuildable(sub Submit) (ask, why string) {
	if c.cat == nil {
		return "", ""
	}
	if _, ok := c.cat.Module(sub.Module); !ok {
		return sub.AskID, fmt.Sprintf("%s is no longer in the catalogue (it was when the plan was made); not built", sub.Module)
	}
	platforms, ids := sub.platformAsks()
	for i, p := range platforms {
		if slices.Contains(c.catPlatforms, p) {
			continue
		}
		return ids[i], fmt.Sprintf("the catalogue no longer builds %s for %s (it builds for %s): the seat's queue has no subject for it; not built",
			sub.Module, p, strings.Join(c.catPlatforms, ", "))
	}
	return "", ""
}

// flush makes a batch's effects durable and visible, retrying (with
// backoff) for at most Config.StoreRetryFor: events are acknowledged only
// after it. Its steps, in order: persist the state, publish the asks of
// the plans stored, settle what settled (the hand-over to deployment),
// prune old plans. A plan whose state the store still refuses when the
// bound passes is reported; its writes and asks wait for the next flush,
// and the other plans go on.
func (c *Controller) flush(ctx context.Context) error {
	clk := c.turnClock(ctx)
	c.assemble(ctx, false)
	c.fillWindows(ctx)
	clk.lap("windows filled", len(c.submits))
	clk.log(c.log, "filled")
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

func (c *Controller) flushOnce(ctx context.Context) error {
	finished, released, waiting, records := c.phases()
	// A plan with a write still refused keeps its asks, unpublished, and
	// is not settled: an ask goes out only once the state that says it is
	// queued is stored. The best asks go out first (firstAsks, in the
	// order they were ranked), once their modules are stored queued, and
	// the rest once theirs are. The modules still waiting and the plans'
	// records are stored after the asks go out: a new plan's first asks do
	// not wait for every module of it to be written (a restart takes a
	// module not stored as waiting, which it is).
	n := min(len(c.submits), firstAsks)
	early, late := splitReleased(released, c.submits[:n])
	// Of what finished, only the first asks' bases are stored before they
	// go out: a flush of hundreds of builts (a tier finishing on a
	// thousand machines) stored every one of them, its current image and
	// estimate first, and the best asks waited 0.1-0.2 s for it on three
	// servers.
	bases, rest := c.basesOf(finished, c.submits[:n])
	clk := c.turnClock(ctx)
	perr := c.persist(ctx, bases, early)
	clk.lap("first asks' bases and modules stored", len(bases)+len(early))
	seen := map[string]bool{}
	keep, err := c.submit(ctx, c.submits[:n], heldPlans(c.dirty, bases, early), seen)
	if err != nil {
		return err
	}
	clk.lap("first asks published", n)
	if perr == nil {
		perr = c.persist(ctx, rest, late)
	}
	clk.lap("the rest stored", len(rest)+len(late))
	keepLate, err := c.submit(ctx, c.submits[n:], heldPlans(c.dirty, finished, early, late), seen)
	if err != nil {
		return err
	}
	clk.lap("the other asks published", len(c.submits)-n)
	c.submits = append(keep, keepLate...)
	if perr == nil {
		now, share := c.someWaiting(waiting)
		c.storeShare(ctx, share)
		perr = c.persist(ctx, now, records)
		clk.lap("waiting modules and records stored", len(now)+len(records))
	}
	held := heldPlans(c.dirty, finished, released, waiting, records)
	settled := c.settle(ctx, held)
	for id := range c.dirtyRun {
		if !held[id] {
			delete(c.dirtyRun, id)
		}
	}
	if settled {
		c.prune(ctx)
	}
	clk.log(c.log, "flushed")
	return perr
}

// turnLaps are how long the steps of a turn took, in the debug log: a
// busy plan's outcomes wait for the turns before them, and on a cluster
// its writes are most of a turn. nil (when the log does not take debug
// lines) times nothing.
type turnLaps struct {
	at    time.Time
	attrs []any
	did   bool // a step did something: else nothing is written
}

// turnClock starts timing a turn's steps if the log takes debug lines.
func (c *Controller) turnClock(ctx context.Context) *turnLaps {
	if !c.log.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	return &turnLaps{at: time.Now()}
}

// lap notes the step since the last: what it did to how many, how long.
func (t *turnLaps) lap(step string, n int) {
	if t == nil {
		return
	}
	now := time.Now()
	t.attrs = append(t.attrs, step, fmt.Sprintf("%d in %s", n, now.Sub(t.at).Round(100*time.Microsecond)))
	t.at = now
	t.did = t.did || n > 0
}

// log writes the laps as one debug line, if a step did something.
func (t *turnLaps) log(log *slog.Logger, msg string) {
	if t != nil && t.did {
		log.Debug(msg, t.attrs...)
	}
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
// stored built. (flushOnce does both twice: for the first asks, their
// finished bases alone and then their modules; once those asks are out,
// the rest.) A module stored finished later than its event would allow is
// still building in the store, its event unacknowledged: a restart is
// delivered the event again. Then, once the asks are out (flushOnce), the modules
// still waiting: a module not stored is loaded as waiting. Last the plan
// records: a record that says the plan settled
// is stored only after everything it settled, so a crash before it leaves
// the plan running, to be resumed, and its events (unacknowledged)
// delivered again
// What a phase stored leaves c.dirty; what the store refused stays, for
// the next try, and the later phases wait for it.
func (c *Controller) persist(ctx context.Context, phases ...map[string]any) error {
	for _, phase := range phases {
		if len(phase) == 0 {
			continue
		}
		c.awaitShareOf(phase)
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

// phases sorts what changed into the order it is stored in (persist): what
// finished, with the current images and estimates; what it released; the
// modules still waiting; the plans' records.
func (c *Controller) phases() (finished, released, waiting, records map[string]any) {
	if c.dirty == nil {
		c.dirty = map[string]any{}
	}
	for id := range c.dirtyRun {
		if st := c.plans[id]; st != nil {
			c.dirty[PlanKey(id)] = c.record(st)
		}
	}
	finished, released, waiting, records = map[string]any{}, map[string]any{}, map[string]any{}, map[string]any{}
	for k, v := range c.dirty {
		if len(c.owed) > 0 {
			delete(c.owed, k) // its newer state is stored instead
		}
		switch v := v.(type) {
		case PlanRecord:
			records[k] = v
		case ModuleStatus:
			switch {
			case v.State == Waiting:
				waiting[k] = v
			case !v.State.Finished():
				released[k] = v
			default:
				finished[k] = v
			}
		default:
			finished[k] = v
		}
	}
	return finished, released, waiting, records
}

// firstAsks is how many of a flush's asks go out first, once their
// modules alone are stored queued: a new plan of 1,000 modules ready at
// once stored them all before its first ask went out (about 190 ms on
// three servers with sync always). Within one round of the store's writes
// (Store.Parallel).
const firstAsks = 64

// basesOf splits finished into the in-plan bases of subs' modules and the
// rest (the other modules, every current image and estimate).
func (c *Controller) basesOf(finished map[string]any, subs []Submit) (bases, rest map[string]any) {
	if len(subs) == 0 || len(finished) == 0 {
		return nil, finished
	}
	bases, rest = map[string]any{}, maps.Clone(finished)
	for _, sub := range subs {
		st := c.plans[sub.Plan]
		if st == nil {
			continue
		}
		st.ensure()
		i, ok := st.ix.pos[sub.Module]
		if !ok {
			continue
		}
		for _, b := range st.Modules[i].Bases {
			k := ModuleKey(sub.Plan, b)
			if v, ok := rest[k]; ok {
				bases[k] = v
				delete(rest, k)
			}
		}
	}
	return bases, rest
}

// splitReleased splits released into the modules of subs and the rest.
func splitReleased(released map[string]any, subs []Submit) (early, late map[string]any) {
	if len(subs) == 0 {
		return nil, released
	}
	early, late = map[string]any{}, maps.Clone(released)
	for _, sub := range subs {
		k := ModuleKey(sub.Plan, sub.Module)
		if v, ok := late[k]; ok {
			early[k] = v
			delete(late, k)
		}
	}
	return early, late
}

// submit publishes the asks of subs but those of held plans, which it
// returns, to be published once their writes are stored; an ask id seen
// is published once.
func (c *Controller) submit(ctx context.Context, subs []Submit, held map[string]bool, seen map[string]bool) ([]Submit, error) {
	var asks []mesh.Ask
	var keep []Submit
	for _, sub := range subs {
		switch {
		case held[sub.Plan]:
			keep = append(keep, sub)
		case !seen[sub.AskID]:
			seen[sub.AskID] = true
			asks = append(asks, Asks(c.cfg.Registry, sub)...)
		}
	}
	return keep, c.publish(ctx, asks)
}

// waitingPerFlush is how many modules still waiting a flush stores at
// most (someWaiting), and spareEvery how long after a share of them is
// stored the next is taken, if the loop worked events meanwhile (else at
// once: spareIn). The shares are stored beside the loop, but on
// the same servers as its writes: a 10,000-module plan on three servers
// (R3, sync always), 1,000 machines, five runs each, ended 1.050-1.157
// (median 1.071) of its bound with a share every 100 ms after the last,
// 1.045-1.070 (median 1.048) every 300 ms, and its zero-length builds went
// through at 1,226 and 1,425 a second (cascade
// BenchmarkFleet1000/cluster3/agents=1000, MESHBUILD_FLEET_MAKESPANS=5):
// a slower share leaves more modules released before their waiting write,
// which is then never made. The 9,000 of such a plan are 35 shares, each
// 300 ms and its own writes after the last: some 10-20 s to store those
// not released before, the deepest tiers first.
const (
	waitingPerFlush = 256
	spareEvery      = 300 * time.Millisecond
)

// someWaiting is what a flush stores of the modules still waiting: all of
// them up to waitingPerFlush, with the flush's other writes (now); else a
// share of that many, the deepest tiers first, stored beside the loop
// (share: storeShare), one share at a time, the next spareEvery after the
// last was stored (the last share, of fewer, at once). A new plan of
// 10,000 modules publishes its first asks and then stores its 9,000 others
// waiting: on three servers with sync always that held the loop 1.2–1.7 s,
// while the first builds ended and nobody worked their events; stored a
// share every spareEvery by the loop itself, they still took a tenth to a
// fifth of each of its turns for the plan's first seconds (sharewrite.go).
// The rest are owed (c.owed, outside c.dirty, so that a flush does not go
// through them again) for the later shares; a module whose state changes
// meanwhile is stored once, in its new state, and its waiting write is
// dropped (phases), which the shallow tiers, stored last, are most often:
// the module writes fell from 2.9 to 2.4 a module (cascade
// BenchmarkFleet1000/cluster3, 1,000 machines). A module not stored is
// loaded as waiting on a restart (resume).
func (c *Controller) someWaiting(waiting map[string]any) (now, share map[string]any) {
	if len(c.owed) == 0 && len(waiting) <= waitingPerFlush {
		return waiting, nil
	}
	if c.owed == nil {
		c.owed = map[string]any{}
	}
	for k, v := range waiting {
		c.owed[k] = v
		delete(c.dirty, k)
	}
	if c.sharing != nil || len(c.owed) > waitingPerFlush && c.spareIn() > 0 {
		return nil, nil
	}
	share = deepest(c.owed, waitingPerFlush)
	for k := range share {
		delete(c.owed, k)
		if p, ok := PlanOfKey(k); ok && c.plans[p] == nil {
			delete(share, k) // its plan is gone
		}
	}
	return nil, share
}

// deepest is n of the modules of waiting, the deepest tiers first (all of
// them when there are no more): the shallowest tier taken (cut) is the one
// where the count from the deepest reaches n, and gives what is left. Two
// passes, no sort.
func deepest(waiting map[string]any, n int) map[string]any {
	if len(waiting) <= n {
		return maps.Clone(waiting)
	}
	var perTier []int
	for _, v := range waiting {
		t := max(0, v.(ModuleStatus).Tier)
		if t >= len(perTier) {
			perTier = append(perTier, make([]int, t+1-len(perTier))...)
		}
		perTier[t]++
	}
	cut, deeper := len(perTier)-1, 0
	for ; cut > 0 && deeper+perTier[cut] < n; cut-- {
		deeper += perTier[cut]
	}
	some := make(map[string]any, n)
	atCut := n - deeper
	for k, v := range waiting {
		switch t := max(0, v.(ModuleStatus).Tier); {
		case t > cut:
			some[k] = v
		case t == cut && atCut > 0:
			some[k] = v
			atCut--
		}
	}
	return some
}

// spareIn is how long the modules still waiting to be stored wait for
// their next share: what is left of spareEvery since the last was stored
// if the loop worked events meanwhile (busySinceShare), else nothing — a
// loop with no events to work (a big plan's first build running) stores
// them one share after the other.
func (c *Controller) spareIn() time.Duration {
	if !c.busySinceShare {
		return 0
	}
	return max(0, spareEvery-time.Since(c.spared))
}

// heldPlans are the plans with a key of phases that dirty still holds:
// a write the store refused.
func heldPlans(dirty map[string]any, phases ...map[string]any) map[string]bool {
	held := map[string]bool{}
	for _, phase := range phases {
		for k := range phase {
			if _, left := dirty[k]; !left {
				continue
			}
			if p, ok := PlanOfKey(k); ok {
				held[p] = true
			}
		}
	}
	return held
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

// publish submits the asks to the build seat, each with its id as the
// message id, and waits for the bus to store them all.
func (c *Controller) publish(ctx context.Context, asks []mesh.Ask) error {
	if len(asks) == 0 {
		return nil
	}
	if err := c.seatHeld.Err(); err != nil {
		return fmt.Errorf("submitting asks: %w", err)
	}
	futures := make([]jetstream.PubAckFuture, 0, len(asks))
	for _, a := range asks {
		a.Secret = c.askSecret(a.ID)
		data, _ := json.Marshal(a)
		shard := c.shardFor(ctx, a.Platform)
		if shard > 0 {
			c.askShard[a.ID] = shard // absent is shard 0
		}
		f, err := c.js.PublishAsync(mesh.BuildShardSubject(a.Platform, shard), data, jetstream.WithMsgID(a.ID))
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
	c.awaitShare() // none of its keys written after their plan is gone
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

// closedLook is a look that is due at once.
var closedLook = func() <-chan time.Time {
	ch := make(chan time.Time)
	close(ch)
	return ch
}()
