package cascade

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A started changes one module (queued → building, on a machine) and is
// applied at once, but its store write waits up to Config.StartedStoreDelay
// for the module's next change: a short build's started and built — a
// cached rebuild's take tens of milliseconds — are then stored in one
// write of the module instead of two. The started event is acknowledged
// only once the module's record that holds it is stored, so a controller
// that stops before the write leaves the event to be delivered again (the
// next holder of mesh-controller applies it as this one did); one that
// stops cleanly gives it back at once (naks).
//
// While the write waits, the store shows the module queued and the plan's
// counts without it building; everything the controller decides from
// (dispatch windows, the scheduler, the fence, forecasts) reads the state
// in memory, which has it building.

// laterWrite is a module whose store write waits (startedLater): the
// started events it holds unacknowledged, when its write is due, and
// whether the module is written already (touched: its key is dirty, to
// be stored by the next flush).
type laterWrite struct {
	plan, module string
	due          time.Time
	msgs         []jetstream.Msg
	touched      bool
}

// startedLater applies the store write of a started of st's module
// later: the module is written when it changes again or at
// StartedStoreDelay, whichever comes first, and m is acknowledged once that
// write is stored (ackWritten). With a delay of 0 or less the write is
// made with this batch, as for any other event, and m is acknowledged with
// it. It reports whether it took m over (the caller must not acknowledge
// it).
func (c *Controller) startedLater(st *State, module string, m jetstream.Msg, now time.Time) bool {
	if c.cfg.StartedStoreDelay <= 0 || m == nil || c.replaying {
		c.touch(st, module)
		return false
	}
	key := ModuleKey(st.Plan, module)
	// The plan is looked at with the batch (a window with room fills;
	// its record is written), its module later.
	c.touch(st)
	if c.later == nil {
		c.later = map[string]*laterWrite{}
	}
	w := c.later[key]
	if w == nil {
		w = &laterWrite{plan: st.Plan, module: module, due: now.Add(c.cfg.StartedStoreDelay)}
		c.later[key] = w
	}
	w.msgs = append(w.msgs, m)
	if _, dirty := c.dirty[key]; dirty || w.touched {
		// Written with this batch anyway: with the state the started
		// left.
		c.touch(st, module)
	}
	return true
}

// laterTouched marks a module whose write waited as written now (touch
// calls it for every module it marks dirty).
func (c *Controller) laterTouched(key string) {
	if w := c.later[key]; w != nil {
		w.touched = true
	}
}

// laterDue is when the first waiting write is due, if any is.
func (c *Controller) laterDue() (time.Time, bool) {
	var due time.Time
	for _, w := range c.later {
		if !w.touched && (due.IsZero() || w.due.Before(due)) {
			due = w.due
		}
	}
	return due, !due.IsZero()
}

// writeDue marks every waiting write due by now to be made by the next
// flush.
func (c *Controller) writeDue(now time.Time) {
	for _, w := range c.later {
		if w.touched || w.due.After(now) {
			continue
		}
		if st := c.plans[w.plan]; st != nil {
			c.touch(st, w.module)
		}
		// A plan no longer held has been written as it settled:
		// nothing is left to write.
		w.touched = true
	}
}

// ackWritten acknowledges the started events of every module whose record
// holding them is stored (touched, and no longer waiting in dirty).
func (c *Controller) ackWritten() {
	for key, w := range c.later {
		if !w.touched {
			continue
		}
		if _, dirty := c.dirty[key]; dirty {
			continue // refused by the store: written again at the next flush
		}
		for _, m := range w.msgs {
			_ = m.Ack()
		}
		delete(c.later, key)
	}
}

// giveBackLater naks the started events whose write never came, as the
// controller stops: the next holder of mesh-controller has them at once.
func (c *Controller) giveBackLater() {
	for key, w := range c.later {
		for _, m := range w.msgs {
			_ = m.Nak()
		}
		delete(c.later, key)
	}
}
