package claim

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/kvsnap"
	"github.com/meshbuild/meshbuild/mesh"
)

// Ask claims: before a machine builds an ask it claims it, under its own key
// (mesh.AskClaimKey: "<ask>.<machine>", which only that machine's
// credentials may write), with a Lease like a seat's: the lease is the
// key's TTL, so the claim lapses on the server's clock the moment its
// holder stops renewing, whatever any machine's clock says. A claim is
// also bound to its machine's seat claim (it records that claim's token):
// once the machine's seat claim lapses or is released, its ask claims are
// void at once, even inside their own lease.
//
// When the holder is done the claim is settled, not deleted: Finish records
// the outcome announced (a redelivered ask is then acknowledged, not built
// again), Release records that the ask went back to the queue and since
// when it has been failing on infrastructure (the ask's retry budget, spent
// by every attempt on any machine). Settled records carry no TTL: the bucket
// keeps them for the ask's retain.

// AskRecord is the value of a machine's claim of an ask.
type AskRecord struct {
	Ask     string `json:"ask"`
	Machine string `json:"machine"`
	// Holder says which process holds it, for people.
	Holder string `json:"holder"`
	// Attempt is the ask's delivery the claim was made for (1 the first).
	Attempt int `json:"attempt"`
	// Since and Renewed are the holder's clock: for people only.
	Since   time.Time `json:"since"`
	Renewed time.Time `json:"renewed"`
	Lease   string    `json:"lease"`
	Token   string    `json:"token"`
	// Seat is the token of the machine's seat claim this claim is bound
	// to; empty for a holder that has none.
	Seat string `json:"seat,omitempty"`
	// Outcome is the event announced (built, failed): the ask is settled.
	// It is recorded before the event is published, with the event's
	// message id and payload, so that a holder that takes the ask after
	// this one died between the two announces the same outcome under the
	// same id (the stream keeps it once) instead of building it again.
	Outcome string `json:"outcome,omitempty"`
	// MsgID is the announced event's message id; Event its payload.
	MsgID string          `json:"msg_id,omitempty"`
	Event json.RawMessage `json:"event,omitempty"`
	// Released says why the ask went back to the queue; empty while held.
	Released string `json:"released,omitempty"`
	// InfraSince is when the ask began failing on infrastructure, on any
	// machine: the start of its retry budget. Zero until it has.
	InfraSince time.Time `json:"infra_since,omitzero"`
	// Proof is the machine's proof that it was delivered the ask
	// (mesh.AskProof): every machine may write its own claim of any ask,
	// so a claim without it is not a holder's, and Look passes it over.
	Proof string `json:"proof,omitempty"`
	// Reply is the subject that acknowledges the delivery claimed (the
	// reply JetStream gave it): a holder that takes the machine's seat
	// after this one died with the ask hands it back through it
	// (Asks.Left), so that another takes it at once, not after the ack
	// wait. Empty for a claim made outside a delivery.
	Reply string `json:"reply,omitempty"`
}

// Held reports whether the record is a holder's claim still working (not
// settled). Whether it is alive is the key's: a lapsed claim is gone.
func (r AskRecord) Held() bool { return r.Outcome == "" && r.Released == "" }

// AskFound is what a machine finds of an ask's claims before it claims it.
type AskFound struct {
	// Done is a claim whose outcome was announced; nil for none.
	Done *AskRecord
	// Held is a live claim of another holder (or another slot of this
	// machine's agent); nil for none.
	Held *AskRecord
	// InfraSince is the earliest start of the ask's infrastructure
	// failures in any claim; zero for none.
	InfraSince time.Time
	// Attempts is the highest attempt any claim records.
	Attempts int
	// SeatLapsed is a claim that would be held but for its machine's seat
	// claim, which lapsed (its key is gone, not another's): void, yet its
	// holder may be alive — every seat claim lapses in an outage of the bus
	// longer than its lease — and about to claim its seat and the ask
	// again. nil for none.
	SeatLapsed *AskRecord
	// Lapsed are the machines whose claim of the ask lapsed: the bucket
	// keeps the server's marker where each was (for ClaimMarkerTTL), with
	// no value. Some machine was delivered the ask before, whatever the
	// delivery's count says (a cluster that lost the holders' consumer's
	// state counts from one again: mesh.HolderStateInMemory).
	Lapsed []string
}

// Asks is seat's ask claims bucket as machine's holder sees it.
type Asks struct {
	js                               jetstream.JetStream
	kv                               jetstream.KeyValue
	snap                             *kvsnap.Bucket
	claims                           jetstream.KeyValue // the seat claims: what an ask claim is bound to
	seat, machine, holder, seatToken string
	o                                options
}

// ErrNoAskClaims is returned by OpenAsks when the seat's ask claims bucket is
// not raised.
var ErrNoAskClaims = errors.New("no ask claims bucket")

// OpenAsks opens seat's ask claims bucket for machine's holder (holder names
// the process for people). seatToken is the token of the machine's seat
// claim (Lease.Token) every ask claim is bound to; empty binds them to
// nothing. It returns an error matching ErrNoAskClaims when the bucket is
// not raised.
func OpenAsks(ctx context.Context, js jetstream.JetStream, seat, machine, holder, seatToken string, opts ...Option) (*Asks, error) {
	o, err := makeOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := mesh.ValidNodeName(machine); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrOption, err)
	}
	kv, err := js.KeyValue(ctx, mesh.AskClaimsBucket(seat))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: %s (raise the catalogue with this version)", ErrNoAskClaims, mesh.AskClaimsBucket(seat))
	}
	if err != nil {
		return nil, fmt.Errorf("opening the ask claims bucket %s: %w", mesh.AskClaimsBucket(seat), err)
	}
	a := &Asks{js: js, kv: kv, snap: kvsnap.New(js, kv), seat: seat, machine: machine, holder: holder, seatToken: seatToken, o: o}
	if seatToken != "" {
		if a.claims, err = js.KeyValue(ctx, mesh.ClaimsBucket()); err != nil {
			return nil, fmt.Errorf("opening the claims bucket %s: %w", mesh.ClaimsBucket(), err)
		}
	}
	return a, nil
}

// Bucket is the ask claims bucket.
func (a *Asks) Bucket() jetstream.KeyValue { return a.kv }

// Lease is how long an ask claim outlives its holder's last renewal.
func (a *Asks) Lease() time.Duration { return a.o.lease }

// Renew is how often an ask claim is renewed.
func (a *Asks) Renew() time.Duration { return a.o.renew }

// ReadAsk reads machine's claim of ask in kv (a seat's ask claims bucket);
// ok is false when there is none (never made, or lapsed). A claim a replica
// does not show is asked of the bucket's leader before it is taken for
// gone (readLeader).
func ReadAsk(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, ask, machine string) (rec AskRecord, ok bool, err error) {
	key := mesh.AskClaimKey(ask, machine)
	var data []byte
	e, err := kv.Get(ctx, key)
	if err == nil {
		data = e.Value()
	} else if gone(err) {
		data, err = readLeader(ctx, js, kv.Bucket(), key)
	}
	if gone(err) {
		return AskRecord{}, false, nil
	}
	if err != nil {
		return AskRecord{}, false, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return AskRecord{}, false, fmt.Errorf("claim %s is not an ask claim: %w", key, err)
	}
	return rec, true, nil
}

// Look reads every machine's claim of ask. A held claim whose machine's
// seat claim is gone (or is another's now) is void and not reported held;
// nor is one of this machine's own: an agent has an ask in hand on one of
// its slots at most, and the one that looks is that slot (its own claim
// lapsed, or its agent's predecessor's was left). secret is the ask's
// (mesh.Ask.Secret, delivered with it): a claim that does not carry its
// machine's proof of delivery is passed over — neither held, nor done, nor
// counted in the ask's attempts and budget — so a machine that was never
// delivered the ask cannot keep it from its holders by claiming it, nor
// have them announce an outcome it made up. An empty secret takes every
// claim.
func (a *Asks) Look(ctx context.Context, ask, secret string) (AskFound, error) {
	var f AskFound
	// Listed, not watched: the stream leader answers at once when a
	// cluster regains quorum, when a watch's consumer can take seconds to
	// be made — a holder whose claim lapsed in the outage must see within
	// a moment of it that nobody took the ask, and claim it again, before
	// another machine is handed the ask and builds it (kvsnap.Listed).
	keys, err := a.snap.Listed(ctx, mesh.AskClaimKeys(ask))
	if err != nil {
		return f, fmt.Errorf("listing the claims of ask %s: %w", ask, err)
	}
	for _, key := range keys {
		_, machine, _ := cutLast(key)
		rec, ok, err := ReadAsk(ctx, a.js, a.kv, ask, machine)
		if err != nil {
			return f, err
		}
		if !ok {
			// Lapsed: the server's marker (or lapsed while listing).
			f.Lapsed = append(f.Lapsed, machine)
			continue
		}
		if secret != "" && !mesh.ValidAskProof(rec.Proof, secret, ask, rec.Machine) {
			continue // not delivered the ask: not a holder's claim
		}
		f.Attempts = max(f.Attempts, rec.Attempt)
		if !rec.InfraSince.IsZero() && (f.InfraSince.IsZero() || rec.InfraSince.Before(f.InfraSince)) {
			f.InfraSince = rec.InfraSince
		}
		switch {
		case rec.Outcome != "":
			r := rec
			f.Done = &r
		case !rec.Held():
		case rec.Machine == a.machine:
			// This machine's: lapsed under the slot that looks, or left
			// by an agent that is gone (restarted here).
		default:
			bound, lapsed := seatOf(ctx, a.claims, a.seat, rec)
			r := rec
			switch {
			case bound:
				f.Held = &r
			case lapsed:
				f.SeatLapsed = &r
			}
		}
	}
	return f, nil
}

// Left reads this machine's claims bound to seat, the token of a seat claim
// this machine held before the one it holds now — a process that died with
// them, or this process before its seat claim lapsed in an outage — that
// are still held, or settled with an outcome (announced, perhaps not
// acknowledged: a process killed between the two): their asks wait for the
// ack wait unless handed back (through AskRecord.Reply). A claim handed
// back (released) is not returned: its delivery was given back with its
// own delay. Only recent writes are read: a held claim is renewed every
// third of its lease and lapses without, so one written longer ago than two
// leases (and LeftClockSkew for the server's clock against this machine's)
// is gone or settled.
func (a *Asks) Left(ctx context.Context, seat string) ([]AskRecord, error) {
	if seat == "" {
		return nil, nil // claims bound to nothing: nothing tells the previous holder's
	}
	start := time.Now().Add(-2*a.o.lease - LeftClockSkew)
	// Read as a bucket is watched (an ordered push consumer: what a
	// machine's credentials grant on a bucket it reads; they grant no
	// pull), from start.
	legacy, err := a.js.Conn().JetStream()
	if err != nil {
		return nil, fmt.Errorf("reading the ask claims %s left: %w", a.machine, err)
	}
	msgs := make(chan *nats.Msg, 256)
	sub, err := legacy.ChanSubscribe(mesh.MachineAskClaims(a.seat, a.machine), msgs,
		nats.BindStream(mesh.KVStream(mesh.AskClaimsBucket(a.seat))), nats.OrderedConsumer(), nats.StartTime(start))
	if err != nil {
		return nil, fmt.Errorf("reading the ask claims %s left: %w", a.machine, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	pending, err := sub.InitialConsumerPending()
	if err != nil {
		return nil, fmt.Errorf("reading the ask claims %s left: %w", a.machine, err)
	}
	// The last write of each key is what the claim says.
	last := map[string]AskRecord{}
	var order []string
read:
	for n := uint64(0); n < pending; n++ {
		var m *nats.Msg
		select {
		case m = <-msgs:
		case <-ctx.Done():
			return nil, fmt.Errorf("reading the ask claims %s left: %w", a.machine, ctx.Err())
		case <-time.After(leftIdle):
			// The rest lapsed (their TTL) or was removed before it was
			// delivered: no message of them comes.
			break read
		}
		var rec AskRecord
		if _, seen := last[m.Subject]; !seen {
			order = append(order, m.Subject)
		}
		if removed(m.Header) || json.Unmarshal(m.Data, &rec) != nil {
			rec = AskRecord{} // deleted, purged, or the server's marker of a lapse
		}
		last[m.Subject] = rec
		if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
			break read
		}
	}
	var out []AskRecord
	for _, subj := range order {
		if rec := last[subj]; (rec.Held() || rec.Outcome != "") && rec.Ask != "" && rec.Machine == a.machine && rec.Seat == seat {
			out = append(out, rec)
		}
	}
	return out, nil
}

// leftIdle is how long Left waits for the next of the claims it counted:
// one removed after it was counted is never delivered.
const leftIdle = 2 * time.Second

// LeftClockSkew is how far ahead of a machine's clock Left allows the
// server's to be.
const LeftClockSkew = 5 * time.Minute

// kvOperation is the header a key-value bucket marks a delete or purge with.
const kvOperation = "KV-Operation"

// bound reports whether a held claim's machine still holds the seat claim
// it is bound to. A claim bound to nothing is judged on its own lease.
func (a *Asks) bound(ctx context.Context, rec AskRecord) bool {
	return Bound(ctx, a.claims, a.seat, rec)
}

// SeatHeld reports whether this machine's seat claim, the one its ask
// claims are bound to, is held now (true when they are bound to nothing):
// an ask claimed while it is not would be void at once to every other
// machine.
func (a *Asks) SeatHeld(ctx context.Context) bool {
	return a.bound(ctx, AskRecord{Machine: a.machine, Seat: a.seatToken})
}

// Bound reports whether rec, a machine's claim of an ask of seat, is bound
// to the seat claim its machine holds now in claims (the mesh's bucket of
// seat claims, ClaimsBucket): false once that seat claim lapsed, was
// released or is another's — the ask claim is then void, even inside its
// own lease. A claim bound to nothing (or claims nil) is judged on its own
// lease, and so is one whose seat claim cannot be read.
func Bound(ctx context.Context, claims jetstream.KeyValue, seat string, rec AskRecord) bool {
	bound, _ := seatOf(ctx, claims, seat, rec)
	return bound
}

// seatOf reports whether rec is bound to the seat claim its machine holds
// now (see Bound) and, when it is not, whether that seat claim's key is
// gone (lapsed or released) rather than another claim's.
func seatOf(ctx context.Context, claims jetstream.KeyValue, seat string, rec AskRecord) (bound, gone bool) {
	if rec.Seat == "" || claims == nil {
		return true, false
	}
	cur, err := read(ctx, claims, mesh.ClaimKey(seat, rec.Machine))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return false, true // the machine's seat lapsed or was released
	case err != nil:
		return true, false // unknown: the claim's own lease decides
	}
	return cur.Token == rec.Seat, false
}

func cutLast(key string) (string, string, bool) {
	for i := len(key) - 1; i >= 0; i-- {
		if key[i] == '.' {
			return key[:i], key[i+1:], true
		}
	}
	return key, "", false
}

// AskLease is a machine's held claim of an ask: a Lease that Finish or
// Release settles.
type AskLease struct {
	*Lease
	asks   *Asks
	rec    AskRecord
	secret string
}

// Claim claims ask for this machine at attempt, carrying infraSince (the
// ask's budget so far, from Look) and the machine's proof that it was
// delivered the ask (mesh.AskProof of secret, the ask's) and the delivery's
// reply subject (AskRecord.Reply). It writes the machine's own key, with the
// lease as its TTL, and renews it until Finish or Release, or until it is
// lost (Lost, Context).
func (a *Asks) Claim(ctx context.Context, ask, secret string, attempt int, infraSince time.Time, reply string) (*AskLease, error) {
	now := a.o.clock().UTC()
	rec := AskRecord{Ask: ask, Machine: a.machine, Holder: a.holder, Attempt: attempt, Since: now, Renewed: now,
		Lease: a.o.lease.String(), Token: rand.Text(), Seat: a.seatToken, InfraSince: infraSince,
		Proof: mesh.AskProof(secret, ask, a.machine), Reply: reply}
	data, _ := json.Marshal(rec)
	key := mesh.AskClaimKey(ask, a.machine)
	sent := time.Now()
	ack, err := a.js.PublishMsg(ctx, &nats.Msg{Subject: mesh.KVKeySubject(mesh.AskClaimsBucket(a.seat), key), Data: data},
		jetstream.WithMsgTTL(a.o.lease))
	if err != nil {
		return nil, fmt.Errorf("claiming ask %s: %w", ask, err)
	}
	l := newLease(a.js, a.kv, mesh.AskClaimsBucket(a.seat), key, rec.Token, "ask "+ask+" on "+a.machine, ack.Sequence, sent, a.o,
		func(at time.Time) []byte {
			r := rec
			r.Renewed = at
			data, _ := json.Marshal(r)
			return data
		})
	return &AskLease{Lease: l, asks: a, rec: rec, secret: secret}, nil
}

// Record is what the claim says.
func (l *AskLease) Record() AskRecord { return l.rec }

// Finish settles the claim with the outcome announced: a delivery of the
// ask that comes again is acknowledged without building.
func (l *AskLease) Finish(ctx context.Context, outcome string) error {
	v := l.rec
	v.Outcome = outcome
	return l.settle(ctx, v)
}

// Announce settles the claim with the outcome about to be announced, its
// message id and its payload (event), before it is published: whoever
// takes the ask next announces it again under the same id (AskFound.Done).
func (l *AskLease) Announce(ctx context.Context, outcome, msgID string, event []byte) error {
	v := l.rec
	v.Outcome, v.MsgID, v.Event = outcome, msgID, event
	return l.settle(ctx, v)
}

// Release settles the claim as handed back, for why, keeping since when the
// ask has failed on infrastructure (zero for not).
func (l *AskLease) Release(ctx context.Context, why string, infraSince time.Time) error {
	v := l.rec
	if why == "" {
		why = "handed back"
	}
	v.Released, v.InfraSince = why, infraSince
	return l.settle(ctx, v)
}

// settle stops renewing and writes v, with no TTL, if the key is still this
// claim's. A write that lands while the claim's last TTL'd write may be
// expiring on the server is looked at again once that has passed
// (confirm): the server's marker of the lapse can be committed after it.
func (l *AskLease) settle(ctx context.Context, v AskRecord) error {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
	l.mu.Lock()
	held, rev, ttlAt := l.err == nil, l.rev, l.ttlAt
	l.mu.Unlock()
	if !held {
		return fmt.Errorf("settling %s: %w", l.what, l.Err())
	}
	l.end(ErrReleased)
	v.Renewed = l.o.clock().UTC()
	data, _ := json.Marshal(v)
	if err := l.write(ctx, data, rev); err != nil {
		return err
	}
	l.rec = v
	if acked, expires := time.Now(), ttlAt.Add(l.o.lease); acked.After(ttlAt.Add(l.o.lease / 2)) {
		if acked.After(expires) {
			expires = acked
		}
		return l.confirm(ctx, data, expires)
	}
	return nil
}

// write writes data on the claim's key, conditional on revision rev. A bus
// that does not answer is waited for, within ctx: what is settled (an
// outcome about to be announced) is not given up on a timeout.
func (l *AskLease) write(ctx context.Context, data []byte, rev uint64) error {
	wait := 100 * time.Millisecond
	pause := func(err error) error {
		if errors.Is(err, nats.ErrConnectionClosed) || l.js.Conn().IsClosed() {
			// Closed for good (the process is going, or its owner
			// closed it): no try can answer.
			return fmt.Errorf("settling %s: %w", l.what, nats.ErrConnectionClosed)
		}
		if wait == 100*time.Millisecond {
			l.o.log.Warn("settling the claim: the bus does not answer; waiting for it", "claim", l.what, "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("settling %s: %w", l.what, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
		return nil
	}
	for moved := 0; moved < 3; {
		// Each try is bounded on its own: a publish sent while the
		// stream had no leader may never be answered.
		tctx, cancel := context.WithTimeout(ctx, settleTry)
		_, err := l.js.PublishMsg(tctx, &nats.Msg{Subject: l.subject, Data: data}, jetstream.WithExpectLastSequencePerSubject(rev))
		cancel()
		if err == nil {
			return nil
		}
		if !wrongLastSequence(err) {
			if perr := pause(err); perr != nil {
				return perr
			}
			continue
		}
		// A write whose answer was lost moved the key on, or the claim
		// lapsed while the bus was away. The key is this machine's alone
		// (its credentials): still this claim's, or gone with nobody
		// holding or having settled the ask since, it is written as is.
		// A bus that cannot say which yet is waited for.
		tctx, cancel = context.WithTimeout(ctx, settleTry)
		err = l.stillOurs(tctx)
		cancel()
		if errors.Is(err, ErrLost) {
			return err
		} else if err != nil {
			if perr := pause(err); perr != nil {
				return perr
			}
			continue
		}
		moved++
		tctx, cancel = context.WithTimeout(ctx, settleTry)
		_, err = l.js.PublishMsg(tctx, &nats.Msg{Subject: l.subject, Data: data})
		cancel()
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("settling %s: the key kept moving", l.what)
}

// stillOurs returns nil when the claim's key holds this claim, or is gone
// with nobody else holding or having settled the ask since; an error
// matching ErrLost otherwise.
func (l *AskLease) stillOurs(ctx context.Context) error {
	data, err := readLeader(ctx, l.js, l.kv.Bucket(), l.key)
	switch {
	case gone(err):
		f, lerr := l.asks.Look(ctx, l.rec.Ask, l.secret)
		if lerr != nil {
			return fmt.Errorf("settling %s: %w", l.what, lerr)
		}
		if f.Done != nil || f.Held != nil {
			return fmt.Errorf("%w: settling %s: its claim lapsed, and another holder has the ask now", ErrLost, l.what)
		}
		return nil
	case err != nil:
		return fmt.Errorf("settling %s: %w", l.what, err)
	}
	var cur AskRecord
	if json.Unmarshal(data, &cur) != nil || cur.Token != l.token {
		return fmt.Errorf("%w: settling %s: another claim has the key now", ErrLost, l.what)
	}
	return nil
}

// settleTry bounds each try of a settle's write.
const settleTry = 2 * time.Second

// confirmAfter is how long after the claim's last TTL'd write could expire
// (or the settled write landed, if later) the settled claim is looked at
// again: the server expires messages on a timer, and a leader just elected
// catches up on what expired while it was away.
const confirmAfter = 2 * time.Second

// confirm looks at the settled claim again once the claim's last TTL'd
// write has expired (at expires, on this machine's clock, plus
// confirmAfter), and writes it again if the server's marker of that
// expiry was committed after it (seen after a three-server cluster
// regained quorum: the fence then found no claim, refused the genuine
// outcome, and the plan hung).
func (l *AskLease) confirm(ctx context.Context, data []byte, expires time.Time) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("settling %s: %w", l.what, ctx.Err())
	case <-time.After(time.Until(expires.Add(confirmAfter))):
	}
	var (
		cur []byte
		err error
	)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		rctx, cancel := context.WithTimeout(ctx, settleTry)
		cur, err = readLeader(rctx, l.js, l.kv.Bucket(), l.key)
		cancel()
		if err == nil || gone(err) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("settling %s: %w", l.what, err)
		case <-time.After(wait):
		}
	}
	if err == nil {
		var rec AskRecord
		if json.Unmarshal(cur, &rec) != nil || rec.Token != l.token {
			return fmt.Errorf("%w: settling %s: another claim has the key now", ErrLost, l.what)
		}
		return nil
	}
	if err := l.stillOurs(ctx); err != nil {
		return err
	}
	l.o.log.Warn("the settled claim was removed by the server's marker of its lapse, committed after it: written again", "claim", l.what)
	if _, err := l.js.PublishMsg(ctx, &nats.Msg{Subject: l.subject, Data: data}); err != nil {
		return fmt.Errorf("settling %s again: %w", l.what, err)
	}
	return nil
}
