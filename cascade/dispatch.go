package cascade

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Fill submits ready modules, best first, while the plan's window has
// room; without a window it submits every ready module; with a negative
// one, none. Start and Built
// fill by themselves; with a window the caller calls Fill after Started
// (and may after any event: it returns nothing when there is no room or
// nothing ready).
func (s *State) Fill(now time.Time) []Submit {
	s.ensure()
	if !s.Cancelled.IsZero() || s.Window < 0 {
		return nil
	}
	// Nothing ready, or no room: the census says so without a walk.
	if n := s.ix.census; n[Ready] == 0 || (s.Window > 0 && n[Queued] >= s.Window) {
		return nil
	}
	var ready []int
	queued := 0
	for i := range s.Modules {
		switch s.Modules[i].State {
		case Ready:
			ready = append(ready, i)
		case Queued:
			queued++
		}
	}
	if s.Window > 0 {
		room := max(0, s.Window-queued)
		if room < len(ready) && room > selectAtMost {
			// A wide window (the scheduler handing many machines at
			// once): sorting is cheaper than selecting.
			s.order(ready)
			ready = ready[:room]
		} else if room < len(ready) {
			// Select the best room modules in place: O(ready × room), which
			// is O(ready) for the small windows this is for, where sorting
			// every ready module on every event would not be.
			for k := range room {
				best := k
				for j := k + 1; j < len(ready); j++ {
					if s.compare(ready[j], ready[best]) < 0 {
						best = j
					}
				}
				ready[k], ready[best] = ready[best], ready[k]
			}
			ready = ready[:room]
		}
	}
	return s.submit(ready, now)
}

// selectAtMost is the widest room Fill selects the best ready modules for
// one by one; a wider one sorts them.
const selectAtMost = 8

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
		h, err := c.platformHolders(ctx, p)
		if err != nil {
			return 0, err
		}
		idle += max(0, h.Waiting-h.Pending)
	}
	return idle, nil
}

// consumerInfo reads a consumer of stream, bound once into *cons.
func (c *Controller) consumerInfo(ctx context.Context, cons *jetstream.Consumer, stream, name string) (*jetstream.ConsumerInfo, error) {
	if *cons == nil {
		bound, err := c.js.Consumer(ctx, stream, name)
		if err != nil {
			return nil, err
		}
		*cons = bound
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return (*cons).Info(ictx)
}
