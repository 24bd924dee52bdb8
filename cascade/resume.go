package cascade

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// resume loads every running plan, re-submits what was queued and releases
// what a built recorded before the stop had made ready: level-triggered.
func (c *Controller) resume(ctx context.Context) error {
	var recs []PlanRecord
	if err := c.answered(ctx, "reading the stored plans", func() (err error) {
		recs, err = c.store.Plans(ctx)
		return Readable(err, c.unreadable)
	}); err != nil {
		return err
	}
	if err := c.answered(ctx, "reading the current images, keys, shares and estimates", func() error {
		return c.loadKept(ctx)
	}); err != nil {
		return err
	}
	var since time.Time
	for _, r := range recs {
		c.seq = max(c.seq, r.Seq)
		if r.Outcome != OutcomeRunning {
			continue
		}
		var st *State
		err := c.answered(ctx, "loading a stored plan", func() (err error) {
			st, err = c.load(ctx, r)
			return err
		})
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

// loadKept reads what the controller keeps beside its plans: the current
// images, the input keys built, the owners' shares and the modules'
// estimates (seeded from the build records where none is stored).
func (c *Controller) loadKept(ctx context.Context) error {
	var err error
	if c.current, err = c.store.Currents(ctx); Readable(err, c.unreadable) != nil {
		return err
	}
	if c.keys, err = c.store.Keys(ctx); Readable(err, c.unreadable) != nil {
		return err
	}
	if c.sched.shares, err = c.store.Shares(ctx); Readable(err, c.unreadable) != nil {
		return err
	}
	est, err := c.store.Estimates(ctx)
	if Readable(err, c.unreadable) != nil {
		return err
	}
	for m, d := range est {
		c.storedBuild[m] = d
		if _, ok := c.lastBuild[m]; !ok {
			c.lastBuild[m] = d
		}
	}
	// A module with no estimate key has its last build's duration in its
	// current record (built).
	for m, cur := range c.current {
		if _, ok := c.lastBuild[m]; !ok && cur.Duration > 0 {
			c.lastBuild[m] = cur.Duration
		}
	}
	c.seedEstimates(ctx)
	return nil
}

// unreadable reports stored records the controller goes on without
// (Readable): a module's is written again with its next change.
func (c *Controller) unreadable(e *UnreadableError) {
	c.log.Error("stored records cannot be read; going on without them", "bucket", e.Bucket, "keys", e.Keys, "err", e.Err)
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
	// Replayed events are not the consumer's to acknowledge: a started is
	// written with the others.
	c.replaying = true
	defer func() { c.replaying = false }()
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

// load rebuilds a stored plan's state: planned again from its trigger, its
// modules from the store. A plan stored before its external bases were
// kept with it is pinned now, once.
func (c *Controller) load(ctx context.Context, r PlanRecord) (*State, error) {
	p, err := c.ix.Plan(r.Trigger)
	if err != nil {
		return nil, fmt.Errorf("planning it again: %w", err)
	}
	mods, err := c.store.Modules(ctx, r.ID)
	if err := Readable(err, c.unreadable); err != nil {
		return nil, err
	}
	st, err := Load(p, r, mods)
	if err != nil {
		return nil, err
	}
	for name, m := range mods {
		if _, ok := st.Module(name); !ok {
			// Planned again from a catalogue that no longer has it: its
			// record stays as it was, outside the plan's counts.
			c.log.Warn("a module of a resumed plan is no longer in the catalogue: left out of the plan", "plan", r.ID, "module", name, "state", m.State)
		}
	}
	st.SetKnown(c.known)
	for _, m := range st.Modules {
		if m.State == Waiting && m.Tree == "" {
			// A module still waiting is stored after its plan's first asks
			// go out (flushOnce): one a stop left unstored has its build
			// context read again, as when the plan was made.
			c.address(ctx, st)
			break
		}
	}
	if len(p.External) > 0 && len(st.External) == 0 {
		if err := c.pin(ctx, st, p); err != nil {
			return nil, err
		}
	}
	return st, nil
}
