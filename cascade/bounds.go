package cascade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// The bounds on a plan's modules that no holder reports: an ask the bus gave
// up on (delivered its consumer's max delivery count and never settled: it
// kills, or is lost by, every holder that takes it) and an ask that expired
// in the queue (the seat's retain passed with nobody holding it). Either
// fails its module for infrastructure, with a message that says which, so
// that its dependents are blocked and a retry (a new ask) can mend it.

// Abandoned fails the module whose current ask is ask: the bus delivered
// it deliveries times and none of its holders settled it. It returns the
// module and the modules it newly blocked; ok is false when no queued or
// building module has that ask (an earlier attempt's, another plan's).
func (s *State) Abandoned(ask string, deliveries int, now time.Time) (module string, blocked []string, ok bool) {
	s.ensure()
	for _, m := range s.Modules {
		if m.Ask != ask || (m.State != Queued && m.State != Building) {
			continue
		}
		msg := fmt.Sprintf("delivered %d times, never settled: every holder that took the ask stopped (or died) before it reported; retry it once the cause is found", deliveries)
		blocked = s.Failed(mesh.Failed{Plan: s.Plan, Module: m.Module, Ask: ask, Reason: mesh.ReasonInfra, Message: msg}, now)
		return m.Module, blocked, true
	}
	return "", nil, false
}

// Expire fails every queued module whose ask was queued retain or longer
// before now: the seat's work queue has dropped it (its max age), so no
// holder will ever take it, and the plan must not show it queued. It
// returns the modules it failed and those they blocked.
func (s *State) Expire(now time.Time, retain time.Duration) []string {
	if retain <= 0 {
		return nil
	}
	s.ensure()
	var out []string
	for i := range s.Modules {
		m := s.Modules[i]
		if m.State != Queued || m.Queued.IsZero() || now.Sub(m.Queued) < retain {
			continue
		}
		msg := fmt.Sprintf("expired: no holder took the ask within the seat's retain of %s (queued %s); is a machine of its platform online? retry it when one is",
			retain, m.Queued.UTC().Format(time.RFC3339))
		out = append(out, m.Module)
		out = append(out, s.Failed(mesh.Failed{Plan: s.Plan, Module: m.Module, Ask: m.Ask, Reason: mesh.ReasonInfra, Message: msg}, now)...)
	}
	return out
}

// The limits on what a failed module keeps, so that its record is always
// inside the bucket's value limit (mesh.BucketMaxValue, 256 KiB), however
// long the lines its build printed: maxLog lines of at most maxLogLine
// bytes, and a message of at most maxMessage bytes. Even a build that
// printed nothing but control characters (six bytes each in JSON) makes a
// record of 20×6 KiB + 12 KiB, about half the limit.
const (
	maxLogLine = 1 << 10
	maxMessage = 2 << 10
)

// trimLog keeps the last maxLog lines, each cut to maxLogLine bytes.
func trimLog(lines []string) []string {
	lines = lines[max(0, len(lines)-maxLog):]
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = cut(l, maxLogLine)
	}
	return out
}

// cut cuts s to at most n bytes on a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "… (cut)"
	k := n - len(mark)
	for k > 0 && !utf8.RuneStart(s[k]) {
		k--
	}
	return s[:k] + mark
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
	if c.lostSeat("taking a given-up ask out of its queue") {
		return
	}
	if err := stream.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		c.log.Warn("taking a given-up ask out of its queue", "seq", adv.StreamSeq, "err", err)
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
