package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
)

// An ask is claimed before it is built, so that it is built once even when
// the bus redelivers it to a second holder while the first still works on
// it, and so that the controller can tell the machine that holds it from
// any other (it accepts an outcome only from the holder of the ask's
// claim). The claim is the machine's own key in the bucket the seat's
// holders share (claim.Asks): written with the lease as the key's TTL,
// renewed while the machine works, bound to the machine's seat claim, and
// settled — the outcome announced, or handed back and since when the ask
// has failed on infrastructure — when the machine is done. Every lease is
// judged on the server's clock, never on this machine's.

// hold is a slot's hold on one ask's claim.
type hold struct {
	lease *claim.AskLease // nil: claims are off (the bucket is not raised)
	// infraSince is when the ask began failing on infrastructure, on any
	// machine; zero until it has.
	infraSince time.Time
	found      claim.AskFound
	// reply is the delivery's reply subject, kept in the claim
	// (claim.AskRecord.Reply).
	reply string
}

// claimVerdict is what claiming an ask found.
type claimVerdict int

const (
	claimed     claimVerdict = iota // ours now: build it
	claimHeld                       // another holder's claim is alive: leave it
	claimDone                       // its outcome was announced: settle it
	claimFailed                     // the bucket could not be reached: hand it back
)

func (v claimVerdict) String() string {
	switch v {
	case claimed:
		return "claimed"
	case claimHeld:
		return "held by another"
	case claimDone:
		return "outcome recorded already"
	case claimFailed:
		return "claims unreachable"
	}
	return fmt.Sprintf("claimVerdict(%d)", int(v))
}

// askClaims opens the seat's ask claims for this machine; nil if the bucket
// is not raised (claims are then off, and said so). A bus that does not
// answer is waited for: an agent that starts during an outage must not
// build without claims.
func (a *Agent) askClaims(ctx context.Context) *claim.Asks {
	for attempt := 1; ; attempt++ {
		asks, err := claim.OpenAsks(ctx, a.js, mesh.BuildSeat, a.cfg.Machine, claim.Process("build-agent"), a.cfg.SeatToken,
			claim.WithLease(a.lease), claim.WithLogger(a.log), claim.WithTrouble(a.troubled))
		switch {
		case err == nil:
			return asks
		case errors.Is(err, claim.ErrNoAskClaims):
			a.log.Warn("no ask claims bucket: an ask redelivered while its holder still works on it may be built twice, and the controller refuses every outcome; raise the catalogue with this version", "bucket", mesh.AskClaimsBucket(mesh.BuildSeat))
			return nil
		case errors.Is(err, claim.ErrOption):
			a.log.Error("ask claims", "err", err)
			return nil
		case ctx.Err() != nil:
			return nil
		}
		if attempt == 1 {
			a.log.Warn("the ask claims bucket does not answer; waiting for it before pulling", "err", err)
		}
		if backoff.Wait(ctx, bindRetry.Delay(attempt)) != nil {
			return nil
		}
	}
}

// claim claims ask id, delivered for the attempt-th time with reply subject
// reply and stored by the server at queued, for this machine.
// A first delivery is claimed in one write; a redelivery first reads every
// machine's claim of the ask: one settled says the ask is done, one alive
// (and bound to a machine that still holds its seat) leaves it to its
// holder, and the earliest infrastructure failure in any is the ask's
// budget so far. So is a first delivery that may be a redelivery all the
// same: a cluster stopped whole forgets which asks its holders' consumer
// had delivered (mesh.HolderStateInMemory) and delivers them again at once
// counting from one, while their holders still work on them or settle
// them — read when this agent saw the bus fail lately, or the ask was
// queued before this agent started (a farm started again whole).
func (a *Agent) claim(ctx context.Context, ask mesh.Ask, attempt int, queued time.Time, reply string) (*hold, claimVerdict, error) {
	id := ask.ID
	h := &hold{reply: reply}
	if a.claims == nil {
		return h, claimed, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	a.noteReconnects()
	if attempt > 1 || a.sawTrouble() || queued.Before(a.started) {
		f, err := a.claims.Look(ctx, id, ask.Secret)
		if err != nil {
			a.troubled()
			return h, claimFailed, err
		}
		h.found, h.infraSince = f, f.InfraSince
		switch {
		case f.Done != nil:
			return h, claimDone, nil
		case f.Held != nil:
			return h, claimHeld, nil
		case attempt == 1 && len(f.Lapsed) == 0 && f.SeatLapsed == nil:
			// Nobody ever claimed it: a first delivery indeed.
		case f.Attempts == 0 && a.lapsedHolder(id):
			// Delivered before, yet no claim of it is left: its holder's
			// lapsed, while this agent saw the bus fail too — an outage
			// every holder lived through, not a death. Left a while to
			// that holder to claim again (retake), not built twice.
			h.found.Held = &claim.AskRecord{Ask: id, Machine: "its last holder", Holder: "a claim that lapsed while the bus was away"}
			return h, claimHeld, nil
		case f.SeatLapsed != nil && a.lapsedHolder(id):
			// Its holder's claim is void only because that machine's seat
			// claim lapsed, while this agent saw the bus fail too: the
			// same outage, longer than the seat claims' lease (or, on a
			// cluster, their stream's alone). Left a while to that holder
			// to claim its seat and the ask again.
			held := *f.SeatLapsed
			held.Holder = "a claim whose machine's seat lapsed while the bus was away"
			h.found.Held = &held
			return h, claimHeld, nil
		}
	}
	l, err := a.claims.Claim(ctx, id, ask.Secret, attempt, h.infraSince, h.reply)
	if err != nil {
		a.troubled()
		return h, claimFailed, err
	}
	h.lease = l
	return h, claimed, nil
}

// troubled notes that this agent saw the bus fail just now.
func (a *Agent) troubled() { a.trouble.Store(int64(time.Since(a.started))) }

// BusFailed notes that this machine saw the bus fail just now, outside the
// agent: its seat claim's renewal got no answer (claim.WithTrouble). A bus
// that stops answering without dropping the connection (a server frozen)
// is seen only so by an idle machine, which must then leave a redelivered
// ask whose claim lapsed in it to that claim's holder (lapsedHolder), not
// build it a second time.
func (a *Agent) BusFailed() { a.troubled() }

// noteReconnects notes the bus as failed (troubled) when the connection
// reconnected since it last looked: an idle slot's pull may end with no
// error through an outage, and the ask redelivered after it must still be
// left a while to a holder whose claim lapsed in it (lapsedHolder).
func (a *Agent) noteReconnects() {
	if n := a.nc.Stats().Reconnects; a.reconnects.Swap(n) != n {
		a.troubled()
	}
}

// lapsedHolder reports whether a redelivered ask with no claim left should
// be left to the holder whose claim lapsed: this agent saw the bus fail
// within lapseGrace leases (every holder's claims lapse in an outage of
// the bus, and their holders claim them again when it returns), and it has
// not left this ask so for lapseGrace leases already. A machine that died
// is replaced without the wait: nobody else saw the bus fail.
func (a *Agent) lapsedHolder(id string) bool {
	if !a.sawTrouble() {
		return false
	}
	a.deferMu.Lock()
	defer a.deferMu.Unlock()
	first, ok := a.deferred[id]
	if !ok {
		a.deferred[id] = time.Now()
		return true
	}
	if time.Since(first) < lapseGrace*a.lease {
		return true
	}
	delete(a.deferred, id)
	return false
}

// sawTrouble reports whether this agent saw the bus fail within lapseGrace
// leases.
func (a *Agent) sawTrouble() bool {
	t := a.trouble.Load()
	return t != 0 && time.Since(a.started)-time.Duration(t) <= lapseGrace*a.lease
}

// lapseGrace is how many leases after it saw the bus fail an agent leaves
// an ask whose holder's claim lapsed to that holder.
const lapseGrace = 3

// lost reports the error of a hold whose claim was lost while the ask was
// worked on (it lapsed on the server: this machine was cut off or stalled
// for a lease), nil otherwise. Its work is not announced: the ask is
// another machine's now, and the controller would refuse it.
func (h *hold) lost() error {
	if h.lease == nil {
		return nil
	}
	if err := h.lease.Err(); errors.Is(err, claim.ErrLost) {
		return err
	}
	return nil
}

// retake claims the ask again for this machine after its claim lapsed
// while it worked (the bus was away, or the machine stalled, for a lease),
// unless another holder has claimed or settled it since: then the error
// says so, and the work is not announced. It waits for a bus that does
// not answer, for at most retakeFor.
func (a *Agent) retake(ctx context.Context, ask mesh.Ask, attempt int, h *hold) error {
	id := ask.ID
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), retakeFor)
	defer cancel()
	for try := 1; ; try++ {
		// Each try is bounded on its own: a request lost while the bus
		// comes back (a leader being elected) must not hold the machine
		// past the moment another holder is handed the ask.
		tctx, tcancel := context.WithTimeout(ctx, retakeTry)
		l, err := a.claimAgain(tctx, ask, attempt, h)
		tcancel()
		if err == nil {
			a.log.Info("the ask's claim lapsed while the bus was away; nobody took it since: claimed again", "ask", id)
			h.lease = l
			return nil
		}
		if errors.Is(err, errTaken) {
			return err
		}
		if a.nc.IsClosed() {
			// The connection was closed for good (the agent is being
			// stopped, or its owner closed it): no try can answer.
			return fmt.Errorf("its claim lapsed, and the connection to the bus is closed: %w", nats.ErrConnectionClosed)
		}
		a.troubled()
		if backoff.Wait(ctx, retakeRetry.Delay(try)) != nil {
			return fmt.Errorf("its claim lapsed, and the bus did not answer for %s to claim it again: %w", retakeFor, err)
		}
	}
}

// retakeRetry is how often a machine whose ask claim lapsed tries to claim
// it again: soon after the bus returns, before another holder is handed it.
var retakeRetry = backoff.Policy{First: 100 * time.Millisecond, Max: 500 * time.Millisecond}

// retakeFor bounds how long a machine whose ask claim lapsed waits for the
// bus to claim it again; retakeTry bounds each try.
const (
	retakeFor = 30 * time.Second
	retakeTry = 2 * time.Second
)

// settle settles the hold: the outcome announced (event), or handed back
// (event empty) for why.
func (h *hold) settle(ctx context.Context, event, why string) error {
	if h.lease == nil {
		return nil
	}
	// Within retakeFor: a settle written as the claim's lease ran out is
	// looked at again after it (claim.AskLease).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), retakeFor)
	defer cancel()
	if event != "" {
		return h.lease.Finish(ctx, event)
	}
	return h.lease.Release(ctx, why, h.infraSince)
}

// holdContext is ctx for working ask under hold h: cancelled when its
// claim is taken by another. A claim that only lapsed (the bus away, the
// machine stalled) does not stop the work: it is claimed again as soon as
// the bus answers (retakeEarly) — so that the ask, redelivered to another
// machine meanwhile, is left to this one instead of built twice — and, if
// that did not answer while the work went on, when the work ends (retake).
// Once the ask is another's, the work is stopped. The returned func ends
// the watch and returns once it has: h.lease is the work's again.
func (a *Agent) holdContext(ctx context.Context, ask mesh.Ask, attempt int, h *hold) (context.Context, func()) {
	cctx, cancel := context.WithCancelCause(ctx)
	if h.lease == nil {
		return cctx, func() { cancel(nil) }
	}
	watch, stopWatch := context.WithCancel(cctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for l := h.lease; ; l = h.lease {
			select {
			case <-l.Lost():
			case <-watch.Done():
				return
			}
			err := l.Err()
			switch {
			case !errors.Is(err, claim.ErrLost):
				return // settled or released
			case !errors.Is(err, claim.ErrLapsed):
				cancel(err)
				return
			}
			if err := a.retakeEarly(watch, ask, attempt, h); err != nil {
				if errors.Is(err, errTaken) {
					cancel(err)
				}
				return
			}
		}
	}()
	var once sync.Once
	return cctx, func() {
		once.Do(func() {
			stopWatch()
			<-done
			cancel(nil)
		})
	}
}

// errSeatAway is a retake put off until the machine's seat claim is held.
var errSeatAway = errors.New("the machine's seat claim is not held (yet)")

// errTaken is matched by a retake refused because another holder claimed
// or settled the ask since this machine's claim lapsed.
var errTaken = errors.New("the ask is another holder's now")

// retakeEarly claims ask again for this machine, while its work goes on,
// once its claim lapsed (see holdContext): it tries until the claim is
// written (h.lease is then the new one), another holder has the ask
// (errTaken), or ctx ends.
func (a *Agent) retakeEarly(ctx context.Context, ask mesh.Ask, attempt int, h *hold) error {
	for try := 1; ; try++ {
		tctx, tcancel := context.WithTimeout(ctx, retakeTry)
		var l *claim.AskLease
		err := errSeatAway
		if a.claims.SeatHeld(tctx) {
			// Not before the machine's seat is held again: claimed
			// while it is not, the ask would be void to every other
			// machine, and one could take it.
			l, err = a.claimAgain(tctx, ask, attempt, h)
		}
		tcancel()
		if err == nil {
			a.log.Info("the ask's claim lapsed while the bus was away; nobody took it since: claimed again while its build goes on", "ask", ask.ID)
			h.lease = l
			return nil
		}
		if errors.Is(err, errTaken) || a.nc.IsClosed() {
			return err
		}
		a.log.Debug("claiming a lapsed ask claim again while its build goes on: not yet", "ask", ask.ID, "try", try, "err", err)
		if backoff.Wait(ctx, retakeRetry.Delay(try)) != nil {
			return ctx.Err()
		}
	}
}

// claimAgain claims ask for this machine once more after its claim lapsed,
// unless another holder has claimed or settled it since (errTaken).
func (a *Agent) claimAgain(ctx context.Context, ask mesh.Ask, attempt int, h *hold) (*claim.AskLease, error) {
	f, err := a.claims.Look(ctx, ask.ID, ask.Secret)
	switch {
	case err != nil:
		return nil, err
	case f.Done != nil:
		return nil, fmt.Errorf("%w: its claim lapsed, and %s settled it since", errTaken, f.Done.Machine)
	case f.Held != nil:
		return nil, fmt.Errorf("%w: its claim lapsed, and %s holds it now", errTaken, f.Held.Machine)
	}
	return a.claims.Claim(ctx, ask.ID, ask.Secret, attempt, h.infraSince, h.reply)
}

// claimLease is the lease of an ask's claim: lease when set, else three
// quarters of the holders' ack wait in whole seconds (of mesh.HolderAckWait
// when the consumer has none), at least a second. A machine that dies
// leaves its ask's claim to lapse within it, so the ask, redelivered after
// the ack wait, finds it gone and is built elsewhere at once (issue 20: a
// lost machine is replaced in seconds).
func claimLease(lease, ackWait time.Duration) time.Duration {
	switch {
	case lease > 0:
		return lease
	case ackWait <= 0:
		ackWait = mesh.HolderAckWait
	}
	return max(time.Second, (ackWait * 3 / 4).Truncate(time.Second))
}

// claimedBy says who holds a claim, for a hand-back's log.
func claimedBy(r *claim.AskRecord) error {
	if r.Attempt == 0 {
		return fmt.Errorf("claimed by %s (%s)", r.Machine, r.Holder)
	}
	return fmt.Errorf("claimed by %s (%s, attempt %d)", r.Machine, r.Holder, r.Attempt)
}

// handBackLeft hands back the asks this machine's previous holder of its
// seat (Config.Succeeds) left claimed. A process killed with asks in hand
// says nothing: each would wait out the holders' ack wait from its last
// heartbeat before the server delivers it again, though the claim of it is
// void the moment this holder took the seat (it is bound to the previous
// seat claim). Each is naked through the reply of the delivery its claim
// recorded (claim.AskRecord.Reply), unless it was settled since or another
// holder has it now: the server delivers it again at once. So is one whose
// outcome it recorded, in case it was killed before it acknowledged the
// delivery. A reply that is not an acknowledgement of the seat's queue is
// left alone.
func (a *Agent) handBackLeft(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, handBackLeftFor)
	defer cancel()
	left, err := a.claims.Left(ctx, a.cfg.Succeeds)
	if err != nil {
		a.log.Warn("reading the asks this machine's previous holder left claimed: each goes back after the ack wait", "err", err)
		return
	}
	stream := "." + mesh.SeatStream(mesh.BuildSeat) + "."
	announced := 0
	for _, rec := range left {
		log := a.log.With("ask", rec.Ask, "attempt", rec.Attempt, "claimed", rec.Since.Format(time.RFC3339), "holder", rec.Holder)
		if !strings.HasPrefix(rec.Reply, "$JS.ACK.") || !strings.Contains(rec.Reply, stream) {
			if rec.Held() {
				log.Warn("an ask this machine's previous holder left claimed, without the acknowledgement of its delivery: it goes back after the ack wait", "reply", rec.Reply)
			}
			continue
		}
		if rec.Outcome != "" {
			// Its outcome recorded, its delivery perhaps not acknowledged
			// (killed between the two): given back, it is delivered again
			// now, and whoever takes it announces the recorded outcome
			// again under its message id and acknowledges it (claimDone),
			// building nothing. The server ignores the nak of a delivery
			// acknowledged already, as most of these are.
			if err := a.nc.Publish(rec.Reply, []byte(nakBody)); err != nil {
				log.Warn("handing back an ask whose outcome this machine's previous holder recorded", "err", err)
				continue
			}
			announced++
			log.Debug("handed back an ask whose outcome this machine's previous holder recorded, in case it was not acknowledged", "outcome", rec.Outcome)
			continue
		}
		f, err := a.claims.Look(ctx, rec.Ask, "")
		switch {
		case err != nil:
			log.Warn("an ask this machine's previous holder left claimed: its claims cannot be read; it goes back after the ack wait", "err", err)
			continue
		case f.Done != nil || f.Held != nil:
			continue // settled since, or another holder's now
		}
		if err := a.nc.Publish(rec.Reply, []byte(nakBody)); err != nil {
			log.Warn("handing back an ask this machine's previous holder left claimed", "err", err)
			continue
		}
		log.Info("handed back an ask this machine's previous holder left claimed (it stopped without handing it back): the server delivers it again now, not after the ack wait")
	}
	if announced > 0 {
		a.log.Info("handed back the asks whose outcome this machine's previous holder recorded: one it had not acknowledged is announced again now and acknowledged, not after the ack wait (the server ignores the rest)", "asks", announced)
	}
	if err := a.nc.FlushWithContext(ctx); err != nil {
		a.log.Warn("handing back the asks this machine's previous holder left claimed", "err", err)
	}
}

// handBackLeftFor bounds handBackLeft.
const handBackLeftFor = 30 * time.Second

// nakBody is JetStream's negative acknowledgement: deliver it again.
const nakBody = "-NAK"
