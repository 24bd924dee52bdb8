package cascade

import (
	"context"
	"fmt"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

// SchedulingObserver is told, for each ask a holder started, how long its
// module waited from ready (every base built) to started, with its plan's
// priority and owner (metrics). An Observer that implements it is told.
type SchedulingObserver interface {
	Dispatched(priority int, owner string, wait time.Duration)
}

// scheduler is the controller's scheduling state across plans.
type scheduler struct {
	// shares are the owners' recent machine-time, by owner (persisted).
	shares map[string]Share
	// held says, by plan, what its ready asks wait behind (PlanRecord.Held).
	held map[string]string
}

// schedule hands idle holders the held asks of the running plans, as
// Allot shares them: as many as holders wait for work, read from the
// seat consumers' state. It reports whether asks are still held, so that
// the caller looks again soon: a holder that just announced built may not
// have asked for its next yet.
func (c *Controller) schedule(ctx context.Context) bool {
	now := time.Now().UTC()
	claims := make([]Claim, 0, len(c.plans))
	var held []*State
	for _, st := range c.plans {
		n := st.Counts()
		if n.inFlight() == 0 {
			continue
		}
		claims = append(claims, Claim{Plan: st.Plan, Priority: st.Priority, Owner: st.Owner, Seq: st.Seq,
			Ready: n.Ready, Busy: n.Queued + n.Building + n.Cancelling, Cap: st.Cap, Estimate: st.MeanEstimate()})
		if n.Ready > 0 {
			held = append(held, st)
		}
	}
	w := c.rewindow()
	for id := range c.sched.held {
		if st := c.plans[id]; st == nil || st.Counts().Ready == 0 {
			c.setHeld(id, "")
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
	// Asks released in this batch and not yet published will meet the
	// waiting holders first.
	idle = max(0, idle-len(c.submits))
	if idle > 0 && mixedPriorities(claims) && !c.caughtUp(ctx, now) {
		// A holder announces its outcome, then asks for its next: the
		// pull seen may be one whose built unblocks an urgent plan's next
		// module, not worked yet. Hand out once it is (its batch looks
		// again), or after an idle look at most.
		return true
	}
	a := Allot(idle, claims, c.usage(now), SharePolicy{Weights: c.cfg.Shares, Caps: c.cfg.Caps})
	still := false
	for _, st := range held {
		if n := a.Give[st.Plan]; n > 0 {
			st.Window = st.Counts().Queued + n
			c.enqueue(st, st.Fill(now))
			st.Window = w
		}
		c.setHeld(st.Plan, a.Held[st.Plan])
		still = still || st.Counts().Ready > 0
	}
	return still
}

// mixedPriorities reports whether the running plans are of more than one
// priority: then a module an outcome makes ready may go before every ready
// ask of another plan, and schedule waits for the outcomes (caughtUp). Of
// one priority, the plans share by owner, which one hand-out more or less
// barely moves, and waiting would cost every hand-out a look at the events.
func mixedPriorities(claims []Claim) bool {
	for _, cl := range claims[min(1, len(claims)):] {
		if cl.Priority != claims[0].Priority {
			return true
		}
	}
	return false
}

// caughtUp reports whether every event stored for the controller when it
// looked has been worked: a holder's outcome is stored before it pulls
// again, so the outcome of one whose pull was counted idle is then applied.
// The events consumer says how far the server delivered it (a stream
// sequence) and how many more of its events wait: the controller must have
// seen that sequence, and as many events past it as waited (they are
// delivered in order; a redelivery is of one delivered before). While
// behind, that mark is kept, not asked again, and the hand-out waits for
// it for an idle look at most (IdleLook), so that a steady stream of
// events does not keep it. An unanswered question does not hold it.
func (c *Controller) caughtUp(ctx context.Context, now time.Time) bool {
	if c.behind == nil {
		info, err := c.consumerInfo(ctx, &c.events, mesh.EventsStream, mesh.ModuleConsumer(c.module))
		if err != nil {
			return true
		}
		c.floor.seen(info)
		c.behind = &eventMark{delivered: info.Delivered.Stream, pending: info.NumPending, since: now}
	}
	b := c.behind
	if c.eventsSeen >= b.delivered && b.past >= b.pending || now.Sub(b.since) >= c.cfg.IdleLook {
		c.behind = nil
		return true
	}
	return false
}

// eventMark is what caughtUp waits to have seen: the stream sequence the
// server had delivered and how many events waited past it (pending), with
// how many past it were seen since (past).
type eventMark struct {
	delivered, pending, past uint64
	since                    time.Time
}

// rewindow sets every plan's window (planWindow) and returns it.
func (c *Controller) rewindow() int {
	w := c.planWindow()
	for _, st := range c.plans {
		st.Window = w
	}
	return w
}

// alone reports whether the scheduler has nothing to rank: at most one
// plan running and no cap. Then a plan's released ask goes out at once
// when it has none queued (a window of 1), without waiting for the next
// look at idle holders; otherwise every released ask is held for the
// scheduler.
func (c *Controller) alone() bool {
	if len(c.cfg.Caps) > 0 {
		return false
	}
	running := 0
	for _, st := range c.plans {
		if st.Cap > 0 {
			return false
		}
		if st.Counts().inFlight() > 0 {
			running++
		}
	}
	return running <= 1
}

// setHeld records what a plan's ready asks wait behind; a change is
// written with the plan's record.
func (c *Controller) setHeld(plan, why string) {
	if c.sched.held[plan] == why {
		return
	}
	if why == "" {
		delete(c.sched.held, plan)
	} else {
		c.sched.held[plan] = why
	}
	if st := c.plans[plan]; st != nil {
		c.touch(st)
	}
}

// usage is every owner's recent machine-time now, in seconds.
func (c *Controller) usage(now time.Time) map[string]float64 {
	out := make(map[string]float64, len(c.sched.shares))
	for o, s := range c.sched.shares {
		out[o] = s.Now(now, c.cfg.ShareHalfLife)
	}
	return out
}

// charge counts a build's machine-time to its plan's owner.
func (c *Controller) charge(st *State, d time.Duration, now time.Time) {
	if d <= 0 {
		return
	}
	sh := c.sched.shares[st.Owner]
	sh.Owner = st.Owner
	sh = sh.Add(d, now, c.cfg.ShareHalfLife)
	c.sched.shares[st.Owner] = sh
	if c.dirty == nil {
		c.dirty = map[string]any{}
	}
	c.dirty[ShareKey(st.Owner)] = sh
}

// observeDispatched tells the observer how long each module started since
// the last batch waited from ready to started.
func (c *Controller) observeDispatched() {
	so, ok := c.obs.(SchedulingObserver)
	for id := range c.dirtyRun {
		st := c.plans[id]
		if st == nil {
			continue
		}
		for _, name := range st.Dispatched() {
			m, _ := st.Module(name)
			if ok && !m.ReadyAt.IsZero() && !m.Started.IsZero() {
				so.Dispatched(st.Priority, st.Owner, max(0, m.Started.Sub(m.ReadyAt)))
			}
		}
	}
}

// planSchedule sets a new plan's priority, owner and cap: what its
// trigger asked (sched), else the catalogue's default priority for a
// pushed ref (mesh.Build.Priority: the highest any module built from the
// pushed repository declares) and the trigger's repository as owner (a
// rebuild's: its first module's).
func (c *Controller) planSchedule(st *State, sched *mesh.Schedule) error {
	if sched == nil {
		sched = &mesh.Schedule{}
	}
	if p := sched.Priority; p != nil && (*p < mesh.MinPriority || *p > mesh.MaxPriority) {
		return fmt.Errorf("%w: priority %d: want %d to %d", ErrBadRequest, *p, mesh.MinPriority, mesh.MaxPriority)
	}
	if sched.Cap < 0 {
		return fmt.Errorf("%w: cap %d: want 1 machine or more, or 0 for none", ErrBadRequest, sched.Cap)
	}
	t := st.Trigger
	repo := planner.NormaliseRepo(t.Repo)
	if repo == "" && len(st.Modules) > 0 {
		repo = planner.NormaliseRepo(st.Modules[0].Source.Repo)
	}
	st.Owner, st.Cap = repo, sched.Cap
	if sched.Owner != "" {
		st.Owner = sched.Owner
	}
	if sched.Priority != nil {
		st.Priority = *sched.Priority
		return nil
	}
	if t.Kind != planner.KindPush {
		return nil
	}
	found := false
	for _, m := range st.Modules {
		man, ok := c.cat.Module(m.Module)
		if !ok || planner.NormaliseRepo(m.Source.Repo) != repo {
			continue
		}
		if p, ok := man.Build.PriorityFor(t.Ref); ok && (!found || p > st.Priority) {
			st.Priority, found = p, true
		}
	}
	return nil
}

// setPriority is the priority tool: a running plan's priority changes, and
// its held asks are ranked by it at the next look at idle holders.
func (c *Controller) setPriority(ctx context.Context, req Request) (*State, error) {
	if req.Schedule == nil || req.Schedule.Priority == nil {
		return nil, fmt.Errorf("%w: a priority change needs a plan and a priority", ErrBadRequest)
	}
	p := *req.Schedule.Priority
	if p < mesh.MinPriority || p > mesh.MaxPriority {
		return nil, fmt.Errorf("%w: priority %d: want %d to %d", ErrBadRequest, p, mesh.MinPriority, mesh.MaxPriority)
	}
	st, err := c.plan(ctx, req.Plan)
	if err != nil {
		return nil, err
	}
	st.Priority = p
	c.touch(st)
	c.log.Info("plan priority changed", "plan", st.Plan, "priority", p)
	return st, nil
}
