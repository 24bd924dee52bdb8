package cascade

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// The events floor: how far the controller's consumer on EVENTS had every
// event acknowledged (its ack floor, a stream sequence), kept in the plan
// store. A consumer that forgets what it delivered — one kept in memory
// (mesh.HolderStateInMemory) on a cluster stopped whole, or one deleted
// and made again by the next raise — delivers the stream again from its
// start: a week of events (mesh.EventsMaxAge), among them pushes whose
// plans were pruned long since, which would be planned and built again.
// An event at or below the floor stored was acknowledged before, so it was
// worked: it is acknowledged again and not worked. The floor is of one
// stream: one made anew (its creation time differs) numbers from one
// again, and the floor stored for the old one is not applied to it.

// floorKeeper is the controller's events floor.
type floorKeeper struct {
	// stream is EVENTS' creation time; applied is the floor stored
	// when the controller started, for that stream (0: none).
	stream  time.Time
	applied uint64
	// ack is the highest ack floor read of the consumer; stored is the
	// highest stored, at storedAt; read is when the consumer was last
	// read.
	ack, stored      uint64
	storedAt, readAt time.Time
	// skipped counts the events acknowledged again without being worked.
	skipped int
}

// floorEvery is how often the floor is stored while it moves.
const floorEvery = time.Second

// seen notes the ack floor of a read of the events consumer.
func (f *floorKeeper) seen(info *jetstream.ConsumerInfo) {
	f.ack = max(f.ack, info.AckFloor.Stream)
}

// loadFloor reads EVENTS' creation time and the floor stored for it.
func (c *Controller) loadFloor(ctx context.Context) error {
	st, err := c.js.Stream(ctx, mesh.EventsStream)
	if err != nil {
		return err
	}
	c.floor.stream = st.CachedInfo().Created
	fl, ok, err := c.store.Floor(ctx)
	if err != nil {
		return err
	}
	c.floor.applied, c.floor.stored = 0, 0
	switch {
	case !ok:
	case fl.Stream.Equal(c.floor.stream):
		c.floor.applied, c.floor.stored = fl.Through, fl.Through
	default:
		c.log.Info("the events floor stored is of a stream made before this one: not applied", "stored", fl.Through, "its stream", fl.Stream, "this stream", c.floor.stream)
	}
	return nil
}

// pastFloor acknowledges, without working them, the events of batch at or
// below the floor stored when the controller started: delivered again by
// a consumer that forgot it had them acknowledged. It returns the rest.
func (c *Controller) pastFloor(batch []jetstream.Msg) []jetstream.Msg {
	if c.floor.applied == 0 {
		return batch
	}
	kept := batch[:0]
	skipped := 0
	for _, m := range batch {
		if md, err := m.Metadata(); err == nil && md.Sequence.Stream <= c.floor.applied {
			_ = m.Ack()
			skipped++
			continue
		}
		kept = append(kept, m)
	}
	if skipped > 0 {
		if c.floor.skipped == 0 {
			c.log.Warn("events acknowledged before are delivered again (the controller's consumer forgot them: a cluster stopped whole, or the consumer made anew): acknowledged, not worked", "floor", c.floor.applied)
		}
		c.floor.skipped += skipped
		c.log.Debug("events below the floor acknowledged again", "events", skipped, "so far", c.floor.skipped)
	}
	return kept
}

// keepFloor stores the consumer's ack floor when it moved, at most every
// floorEvery: read of the consumer here when nothing else read it since.
func (c *Controller) keepFloor(ctx context.Context, now time.Time) {
	if now.Sub(c.floor.storedAt) < floorEvery || c.eventsSeen <= c.floor.stored {
		return
	}
	if now.Sub(c.floor.readAt) >= floorEvery {
		c.floor.readAt = now
		if info, err := c.consumerInfo(ctx, &c.events, mesh.EventsStream, mesh.ModuleConsumer(c.module)); err == nil {
			c.floor.seen(info)
		}
	}
	if c.floor.ack <= c.floor.stored {
		return
	}
	c.floor.storedAt = now
	if err := c.store.PutFloor(ctx, EventsFloor{Stream: c.floor.stream, Through: c.floor.ack}); err != nil {
		c.log.Debug("storing the events floor", "err", err)
		return
	}
	c.floor.stored = c.floor.ack
}
