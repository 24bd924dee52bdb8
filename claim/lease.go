package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
)

// Lease is a held claim. It renews itself until Release, or until it is
// lost; then Lost is closed and the holder must stop working as the seat's
// holder.
type Lease struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	key string
	rec Record
	o   options

	// subject is the key's subject (renewals are published on it), what
	// names the claim in logs and errors, token tells this claim from any
	// other on the key, and value is its record renewed at a time.
	subject, what, token string
	value                func(renewed time.Time) []byte

	mu  sync.Mutex
	rev uint64
	err error
	// ttlAt is when the last write carrying the lease as its TTL (the
	// claim, a renewal) was acknowledged: the server expires it no later
	// than a lease after (AskLease.settle looks again after that).
	ttlAt time.Time
	// giveUpAt is when, by this process's clock, the claim stops counting
	// as held unless renewed before (renew keeps it; Held reads it).
	giveUpAt time.Time

	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// newSeatLease is the lease of seat claim rec, stored at revision rev.
func newSeatLease(js jetstream.JetStream, kv jetstream.KeyValue, key string, rec Record, rev uint64, sent time.Time, o options) *Lease {
	l := newLease(js, kv, mesh.ClaimsBucket(), key, rec.Token, rec.Seat+" ("+rec.scope().String()+")", rev, sent, o,
		func(at time.Time) []byte {
			r := rec
			r.Renewed = at
			data, _ := json.Marshal(r)
			return data
		})
	l.rec = rec
	return l
}

// newLease starts renewing the claim on key of bucket, identified by token,
// from revision rev (sent when its write was sent).
func newLease(js jetstream.JetStream, kv jetstream.KeyValue, bucket, key, token, what string, rev uint64, sent time.Time, o options, value func(time.Time) []byte) *Lease {
	l := &Lease{js: js, kv: kv, key: key, o: o, rev: rev, ttlAt: time.Now(),
		subject: mesh.KVKeySubject(bucket, key), what: what, token: token, value: value,
		lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go l.renew(sent)
	return l
}

// Token tells this claim from any other on its key: what a claim bound to
// it (an ask's, to its machine's) records.
func (l *Lease) Token() string { return l.token }

// Record is what the claim says: holder, since, lease.
func (l *Lease) Record() Record { return l.rec }

// Lost is closed when the claim is lost — a renewal was refused because
// another holder has the key now, or no renewal succeeded for a whole lease
// — and when it is released. Err says which.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err is nil while the claim is held; after, it matches ErrLost (with the
// reason) or ErrReleased.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context returns a copy of parent that is cancelled, with Err as its
// cause, when the lease ends: the work of a holder runs under it, so losing
// the seat stops the work.
func (l *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	go func() {
		select {
		case <-l.lost:
			cancel(l.Err())
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

// Held is nil while the claim holds by this process's clock as well as
// the server's: an error matching ErrLost once the lease is lost or
// released, or once the moment its renewals stopped counting has passed
// — whether or not the renewing goroutine has run since. A holder checks
// it before each write it makes as the holder: a process stopped (by hand,
// SIGSTOP) for longer than the lease wakes with its work and its renewals
// runnable at once, and its work may go first; a standby has the seat by
// then, and a write sent before the renewals noticed would land on its
// state. Not WithResume: such a claim is claimed again, not given up.
func (l *Lease) Held() error {
	l.mu.Lock()
	err, giveUp := l.err, l.giveUpAt
	l.mu.Unlock()
	if err != nil || l.o.resume || giveUp.IsZero() || monotonicNow().Before(giveUp) {
		return err
	}
	l.lose(fmt.Errorf("%w (by this process's clock: it stood still, or the bus did)", l.lapse()))
	return l.Err()
}

// Holding says whether a holder still holds its seat — a lease's Held —
// asked before each write the holder makes as such. A nil Holding says
// nothing: it holds.
type Holding func() error

// Err is h's answer: nil while held, and for a nil Holding.
func (h Holding) Err() error {
	if h == nil {
		return nil
	}
	return h()
}

// monotonicNow is Held's clock: time.Now, whose monotonic reading counts
// the time a process was stopped.
var monotonicNow = time.Now

// setGiveUp notes when the claim stops counting as held (Held).
func (l *Lease) setGiveUp(at time.Time) {
	l.mu.Lock()
	l.giveUpAt = at
	l.mu.Unlock()
}

func (l *Lease) end(err error) {
	l.lostOnce.Do(func() {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		close(l.lost)
	})
}

// Release stops renewing and gives the seat up at once, so a standby takes
// it without waiting for the lease. Releasing a lost claim removes nothing:
// the key is another holder's now, or gone.
func (l *Lease) Release(ctx context.Context) error {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
	l.mu.Lock()
	held, rev := l.err == nil, l.rev
	l.mu.Unlock()
	if !held {
		return nil
	}
	l.end(ErrReleased)
	err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
	if wrongLastSequence(err) {
		// A renewal cut short by the release may have been stored: delete
		// at the key's revision if the claim there is still this one.
		e, gerr := l.kv.Get(ctx, l.key)
		var cur Record
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted):
			err = nil // lapsed: nothing to remove
		case gerr != nil:
			err = gerr
		case json.Unmarshal(e.Value(), &cur) != nil || cur.Token != l.token:
			err = nil // another's now: not ours to remove
		default:
			err = l.kv.Delete(ctx, l.key, jetstream.LastRevision(e.Revision()))
		}
	}
	if err != nil {
		return fmt.Errorf("releasing %s: %w (the claim lapses within %s)", l.what, err, l.o.lease)
	}
	l.o.log.Info("released the claim", "claim", l.what)
	return nil
}

// renew renews the claim every o.renew, each renewal conditional on the last
// revision and carrying the lease as the key's TTL. The server forgets the
// claim one lease after it stored the last renewal, which is no earlier than
// one lease after it was sent: the holder gives up half a renewal before
// that (giveUp), so it has stopped before anyone else can have the key —
// or, WithResume, writes the claim again once the key is free (resume).
func (l *Lease) renew(sent time.Time) {
	defer close(l.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-l.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	giveUp := sent.Add(l.giveUp())
	l.setGiveUp(giveUp)
	deadline := time.NewTimer(time.Until(giveUp))
	defer deadline.Stop()
	tick := time.NewTicker(l.o.renew)
	defer tick.Stop()
	// lapsed: no renewal within the lease. Lost, or, WithResume, claimed
	// again (giveUp counted from that write).
	lapsed := func(why error) bool {
		// A claim that lapsed with its holder alive says the bus (or this
		// process) stood still for a lease, whether or not a renewal was
		// tried meanwhile: a process stopped with the server it talks to
		// (by hand: SIGSTOP) sees no renewal fail, only its deadline pass.
		l.o.troubled()
		if !l.o.resume {
			l.lose(why)
			return false
		}
		at, ok := l.resume(ctx, why)
		if ok {
			giveUp = at.Add(l.giveUp())
			l.setGiveUp(giveUp)
			deadline.Reset(time.Until(giveUp))
		}
		return ok
	}
	for {
		select {
		case <-l.stop:
			return
		case <-l.lost:
			return // lost by its holder's look (Held): renewed no more
		case <-deadline.C:
			if !lapsed(l.lapse()) {
				return
			}
			continue
		case <-tick.C:
		}
		at := time.Now()
		err := l.renewOnce(ctx, at, giveUp)
		if err == nil {
			if took := time.Since(at); took > l.slowRenewal() {
				// Answered, but late: the bus stood still until now.
				l.o.troubled()
				l.o.log.Debug("renewed the claim late: the bus stood still", "claim", l.what, "took", took)
			}
			giveUp = at.Add(l.giveUp())
			l.setGiveUp(giveUp)
			deadline.Reset(time.Until(giveUp))
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if !time.Now().Before(giveUp) {
			if !lapsed(l.lapse()) {
				return
			}
			continue
		}
		if !wrongLastSequence(err) {
			l.o.troubled()
			l.o.log.Warn("renewing the claim failed; retrying", "claim", l.what, "err", err)
			continue
		}
		if lost := l.moved(ctx, giveUp); lost != nil {
			if !errors.Is(lost, ErrLapsed) {
				l.lose(lost)
				return
			}
			if !lapsed(lost) {
				return
			}
		}
	}
}

// resumeRetry is how often a lapsed claim WithResume is written again
// while the bus does not answer.
var resumeRetry = backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second}

// resume writes a lapsed claim (why) again under its own token, the key
// created only if it is absent, until it is written (ok, at is when that
// write was sent), another claim has the key (the claim is lost), or the
// lease is released (ctx).
func (l *Lease) resume(ctx context.Context, why error) (at time.Time, ok bool) {
	l.o.log.Warn("the claim lapsed: claiming it again under its own token", "claim", l.what, "err", why)
	for attempt := 1; ; attempt++ {
		sent := time.Now()
		wctx, cancel := context.WithTimeout(ctx, l.o.renew)
		rev, err := l.kv.Create(wctx, l.key, l.value(l.o.clock().UTC()), jetstream.KeyTTL(l.o.lease))
		if errors.Is(err, jetstream.ErrKeyExists) {
			var cur Record
			if cur, err = read(wctx, l.kv, l.key); err == nil && cur.Token == l.token {
				// Our own write, its acknowledgement lost: take it up.
				var e jetstream.KeyValueEntry
				if e, err = l.kv.Get(wctx, l.key); err == nil {
					rev = e.Revision()
				}
			} else if err == nil {
				cancel()
				l.lose(fmt.Errorf("%w: %w", ErrLost, &ClaimedError{Record: cur}))
				return time.Time{}, false
			}
		}
		cancel()
		if err == nil {
			l.mu.Lock()
			l.rev, l.ttlAt = rev, time.Now()
			l.mu.Unlock()
			l.o.log.Info("claimed again under its own token after it lapsed", "claim", l.what, "attempts", attempt)
			return sent, true
		}
		l.o.troubled()
		if backoff.Wait(ctx, resumeRetry.Delay(attempt)) != nil {
			return time.Time{}, false
		}
	}
}

// renewOnce publishes one renewal sent at at, conditional on the last
// revision, and takes up the revision it was stored at.
func (l *Lease) renewOnce(ctx context.Context, at, giveUp time.Time) error {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	data := l.value(l.o.clock().UTC())
	// A renewal in flight may not outlast the claim it renews.
	end := at.Add(l.o.renew)
	if giveUp.Before(end) {
		end = giveUp
	}
	pctx, pcancel := context.WithDeadline(ctx, end)
	defer pcancel()
	ack, err := l.js.PublishMsg(pctx, &nats.Msg{Subject: l.subject, Data: data},
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(l.o.lease))
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.rev, l.ttlAt = ack.Sequence, time.Now()
	l.mu.Unlock()
	return nil
}

// moved reads the key a renewal found moved on without us: our own renewal
// whose acknowledgement was lost (its revision is taken up), else the claim
// lapsed or is another's — the loss it returns. A read that fails is
// retried at the next renewal (nil).
func (l *Lease) moved(ctx context.Context, giveUp time.Time) error {
	rctx, rcancel := context.WithDeadline(ctx, giveUp)
	defer rcancel()
	cur, rerr := read(rctx, l.kv, l.key)
	switch {
	case rerr == nil && cur.Token == l.token:
		if e, gerr := l.kv.Get(rctx, l.key); gerr == nil {
			l.mu.Lock()
			l.rev = e.Revision()
			l.mu.Unlock()
		}
		return nil
	case rerr == nil && l.rec.Seat != "":
		return fmt.Errorf("%w: %w", ErrLost, &ClaimedError{Record: cur})
	case rerr == nil:
		return fmt.Errorf("%w: %s: another claim has the key now", ErrLost, l.what)
	case errors.Is(rerr, jetstream.ErrKeyNotFound) || errors.Is(rerr, jetstream.ErrKeyDeleted):
		return fmt.Errorf("%w: %w: %s: the claim lapsed on the server", ErrLost, ErrLapsed, l.what)
	}
	l.o.log.Warn("reading the claim failed; retrying", "claim", l.what, "err", rerr)
	return nil
}

// lapse is the loss of a lease no renewal succeeded within.
func (l *Lease) lapse() error {
	return fmt.Errorf("%w: %w: %s: no renewal succeeded within the lease (%s)", ErrLost, ErrLapsed, l.what, l.o.lease)
}

// wrongLastSequence reports whether a conditional write was refused because
// the key has moved on from the revision it expected.
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	// A replicated (R>1) stream answers 10164 where one of a single
	// replica answers 10071 (nats.go's jetstream/errors.go).
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// slowRenewal is how long a renewal's answer may take before the holder
// takes it for a bus that stood still (WithTrouble): a second, or half a
// renewal when that is shorter. The last renewal sent in an outage is
// answered when the bus returns (one sent earlier times out at the next
// renewal, itself troubled), so an outage longer than a renewal is seen
// to end within this of its end by every holder of a claim.
func (l *Lease) slowRenewal() time.Duration { return min(time.Second, l.o.renew/2) }

// giveUp is how long after sending its last successful renewal the holder
// gives the claim up: half a renewal inside the lease.
func (l *Lease) giveUp() time.Duration { return l.o.lease - l.o.renew/2 }

func (l *Lease) lose(err error) {
	l.o.log.Error("lost the claim: stop working as its holder", "claim", l.what, "err", err)
	l.end(err)
}
