package cascade

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/seat"
)

// consumeGaveUp consumes the build seat's GaveUpStream: the advisories of
// the asks the server gave up on.
func (c *Controller) consumeGaveUp(ctx context.Context) (<-chan jetstream.Msg, func(), error) {
	return c.consume(ctx, mesh.GaveUpStream(mesh.BuildSeat), mesh.GaveUpConsumer(), 16, "given-up asks")
}

// consume binds the durable consumer on stream and delivers its messages
// on a channel, closed if the consumer stops (seat.Consume); stop ends it.
func (c *Controller) consume(ctx context.Context, stream, consumer string, batch int, what string) (<-chan jetstream.Msg, func(), error) {
	s, err := seat.Consume(ctx, c.js, stream, consumer, batch, what, c.log, seat.PullingFor(c.cfg.PullFor))
	if err != nil {
		return nil, nil, err
	}
	return s.Messages(), s.Stop, nil
}

// work takes first and the events already waiting behind it, up to
// Config.Batch, fences them and applies them (event). It returns the batch
// to acknowledge once it is stored: the events event did not settle itself.
func (c *Controller) work(ctx context.Context, first jetstream.Msg, events <-chan jetstream.Msg) []jetstream.Msg {
	batch := []jetstream.Msg{first}
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
	c.saw(batch)
	if batch = c.pastFloor(batch); len(batch) == 0 {
		return nil
	}
	c.busySinceShare = true
	clk := c.turnClock(ctx)
	verdicts := c.fence(ctx, batch)
	clk.lap("fenced", len(verdicts))
	kept := batch[:0]
	for _, m := range batch {
		if !c.event(ctx, m, verdicts) {
			kept = append(kept, m)
		}
	}
	clk.lap("applied", len(batch))
	clk.log(c.log, "worked a batch")
	return kept
}

// saw notes the latest stream sequence of the events worked, and how many
// are past the mark caughtUp waits for.
func (c *Controller) saw(batch []jetstream.Msg) {
	for _, m := range batch {
		if md, err := m.Metadata(); err == nil {
			c.eventsSeen = max(c.eventsSeen, md.Sequence.Stream)
			if c.behind != nil && md.Sequence.Stream > c.behind.delivered {
				c.behind.past++
			}
		}
	}
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
	if m.Subject() == mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed) {
		return c.pushed(ctx, m, now)
	}
	seat, _, event, ok := mesh.SplitHolderEventSubject(m.Subject())
	if !ok || seat != mesh.BuildSeat {
		return false // not the controller's to work
	}
	v, checked := verdicts[m]
	if !checked {
		v = c.check(ctx, m, nil)
	}
	var decoded any
	if v.through() {
		decoded = v.o.decoded
		v = c.taken(ctx, m, event, v.o)
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
	return c.outcome(m, event, decoded, now)
}

// pushed plans a push (a plan that exists already is not made again). A
// push that cannot be read is refused (Term); one that cannot be planned
// is logged and acknowledged.
func (c *Controller) pushed(ctx context.Context, m jetstream.Msg, now time.Time) (settled bool) {
	ev, err := mesh.DecodeEvent[mesh.Pushed](m.Data())
	if err != nil {
		c.log.Warn("refusing an event", "subject", m.Subject(), "err", err)
		_ = m.Term()
		return true
	}
	t := planner.Trigger{Kind: planner.KindPush, Repo: ev.Repo, Commit: ev.Commit, Ref: ev.Ref, Paths: ev.Paths}
	// A push's plan is as new as the push's place on the bus, not as
	// the moment it is planned: a push delivered again after a crash,
	// behind a newer push already planned, stays the older.
	var at uint64
	if md, err := m.Metadata(); err == nil {
		at = md.Sequence.Stream
	}
	// A commit the clones lack is fetched beside the loop first
	// (prefetch.go); the push is planned when it is there.
	if p, err := c.ix.Plan(t); err == nil && c.setAside(ctx, m, p) {
		return true
	}
	if _, _, err := c.createPlan(ctx, t, ev.Schedule, now, at); err != nil {
		c.log.Warn("no plan for a push", "repo", ev.Repo, "commit", ev.Commit, "err", err)
	}
	return false
}

// decodedAs is the event the fence read (decoded), else data decoded
// again.
func decodedAs[E mesh.Event](decoded any, data []byte) E {
	if e, ok := decoded.(E); ok {
		return e
	}
	e, _ := mesh.DecodeEvent[E](data)
	return e
}

// outcome applies a fenced event of the build seat (started, built,
// failed, handed back) to its plan. An event of an attempt older than one
// already started is refused (RefusedStale). It reports whether it settled
// the message itself.
func (c *Controller) outcome(m jetstream.Msg, event string, decoded any, now time.Time) (settled bool) {
	switch event {
	case mesh.EventStarted:
		ev := decodedAs[mesh.Started](decoded, m.Data())
		if c.stale(ev.Ask, ev.Attempt) {
			c.refuse(m, &verdict{reason: RefusedStale, err: fmt.Errorf("attempt %d of ask %s started after attempt %d", ev.Attempt, ev.Ask, c.attempts[ev.Ask])})
			return true
		}
		c.attempts[ev.Ask] = max(c.attempts[ev.Ask], ev.Attempt)
		if st := c.plans[ev.Plan]; st != nil && st.Started(ev) {
			// Stored with the module's next change if it comes soon (a
			// short build's built): then acknowledged.
			settled = c.startedLater(st, ev.Module, m, now)
			if ms, _ := st.Module(ev.Module); ms.State == Cancelling {
				// Taken as the plan was cancelled: the holder may have
				// missed the first word.
				c.cancelOnHolders([]string{ev.Ask})
			}
		}
	case mesh.EventBuilt:
		ev := decodedAs[mesh.Built](decoded, m.Data())
		if c.stale(ev.Ask, ev.Attempt) {
			c.refuse(m, &verdict{reason: RefusedStale, err: fmt.Errorf("built by attempt %d of ask %s, after attempt %d started", ev.Attempt, ev.Ask, c.attempts[ev.Ask])})
			return true
		}
		// The image is the module's own repository's, whatever the event
		// says: that is where the fence found the digest.
		ev.Image = c.Image(ev.Module) + "@" + ev.Digest
		delete(c.attempts, ev.Ask)
		c.forgetAsk(ev.Ask)
		st := c.plans[ev.Plan]
		if st == nil {
			return false
		}
		if _, ok := st.Module(ev.Module); !ok {
			return false
		}
		c.built(st, ev, now)
	case mesh.EventFailed:
		ev := decodedAs[mesh.Failed](decoded, m.Data())
		if c.stale(ev.Ask, ev.Attempt) {
			c.refuse(m, &verdict{reason: RefusedStale, err: fmt.Errorf("failed by attempt %d of ask %s, after attempt %d started", ev.Attempt, ev.Ask, c.attempts[ev.Ask])})
			return true
		}
		delete(c.attempts, ev.Ask)
		c.forgetAsk(ev.Ask)
		if st := c.plans[ev.Plan]; st != nil {
			blocked := st.Failed(ev, now)
			c.touch(st, ev.Module)
			c.touch(st, blocked...)
		}
	case mesh.EventHandedBack:
		// A note on the module, not an outcome: the ask is back in the
		// queue, to be retried or waiting for a healthy machine.
		ev := decodedAs[mesh.HandedBack](decoded, m.Data())
		if c.stale(ev.Ask, ev.Attempt) {
			c.refuse(m, &verdict{reason: RefusedStale, err: fmt.Errorf("attempt %d of ask %s handed back, after attempt %d started", ev.Attempt, ev.Ask, c.attempts[ev.Ask])})
			return true
		}
		c.attempts[ev.Ask] = max(c.attempts[ev.Ask], ev.Attempt)
		if st := c.plans[ev.Plan]; st != nil && st.HandedBack(ev) {
			c.touch(st, ev.Module)
		}
	}
	return settled
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
	carried := false // the module's current record written carries the duration
	if cur, ok := st.Current(ev.Module); ok && cur.Digest == ev.Digest {
		carried = c.setCurrent(st, ev.Module) && cur.Duration == ev.Duration
	}
	if ev.Duration > 0 {
		c.lastBuild[ev.Module] = ev.Duration
		// The estimate key is written when it moved, but not for a
		// module that has none while its current record carries the
		// duration (a first build: one write of the module fewer). A
		// restarted controller reads the key, else the current's.
		stored, keyed := c.storedBuild[ev.Module]
		if (keyed || !carried) && estimateMoved(stored, ev.Duration) {
			c.storedBuild[ev.Module] = ev.Duration
			c.dirty[EstimateKey(ev.Module)] = ev.Duration
		}
	}
	if ms, _ := st.Module(ev.Module); ms.State == Built && ms.Key != "" && ms.Digest == ev.Digest {
		rec := KeyRecord{Digest: ms.Digest, Image: ms.Image, Module: ms.Module, Plan: st.Plan, Commit: ms.Commit}
		c.keys[ms.Key] = rec
		c.dirty[InputKeyKey(ms.Key)] = rec
	}
	c.enqueue(st, next)
}
