package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
)

// An ask is claimed before it is built, so that it is built once even when
// the bus redelivers it to a second holder while the first still works on
// it (the bus was away longer than the ack wait). The claim is one key per
// ask in the bucket the seat's holders share (mesh.AskClaimsBucket): created
// if absent, renewed while its holder works, released when the ask goes
// back to the queue, and marked done once its outcome is announced. It also
// carries, across holders, when the ask's infrastructure failures began:
// the retry budget is time (Config.RetryFor), not a count.
//
// (Written against the bucket directly; the lead unifies it with the seat
// claims' lease package.)

// askClaim is the value of an ask's claim.
type askClaim struct {
	// Holder is the machine working on the ask; empty once released.
	Holder string `json:"holder,omitempty"`
	// Until is when the claim lapses unless renewed (the holder's clock).
	Until time.Time `json:"until,omitzero"`
	// InfraSince is when the ask first failed on infrastructure: the start
	// of its retry budget. Zero until it has.
	InfraSince time.Time `json:"infra_since,omitzero"`
	// Done is the outcome announced (built or failed); the ask is settled
	// without building when it comes again.
	Done string `json:"done,omitempty"`
}

// claim is a holder's hold on one ask's claim.
type claim struct {
	kv  jetstream.KeyValue // nil: claims are off (the bucket is not raised)
	key string
	rev uint64
	v   askClaim
}

// claimVerdict is what claiming an ask found.
type claimVerdict int

const (
	claimed     claimVerdict = iota // ours now: build it
	claimHeld                       // another holder's claim is alive: leave it
	claimDone                       // its outcome was announced: settle it
	claimFailed                     // the bucket could not be reached: hand it back
)

// askClaims binds the seat's ask claims bucket; nil if it is not raised
// (claims are then off, and said so). A bus that does not answer is waited
// for: an agent that starts during an outage must not build without claims.
func (a *Agent) askClaims(ctx context.Context) jetstream.KeyValue {
	name := mesh.AskClaimsBucket(mesh.BuildSeat)
	for attempt := 1; ; attempt++ {
		kv, err := a.js.KeyValue(ctx, name)
		switch {
		case err == nil:
			return kv
		case errors.Is(err, jetstream.ErrBucketNotFound):
			a.log.Warn("no ask claims bucket: an ask redelivered while its holder still works on it may be built twice; raise the catalogue with this version", "bucket", name)
			return nil
		case ctx.Err() != nil:
			return nil
		}
		if attempt == 1 {
			a.log.Warn("the ask claims bucket does not answer; waiting for it before pulling", "bucket", name, "err", err)
		}
		if backoff.Wait(ctx, bindRetry.Delay(attempt)) != nil {
			return nil
		}
	}
}

// claim claims ask id for this machine.
func (a *Agent) claim(ctx context.Context, id string) (*claim, claimVerdict, error) {
	c := &claim{kv: a.claims, key: mesh.AskClaimKey(id)}
	if c.kv == nil {
		return c, claimed, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	now := time.Now()
	mine := askClaim{Holder: a.cfg.Machine, Until: now.Add(a.lease)}
	for range 3 {
		// Create first: an ask's first delivery (nearly every one) finds
		// no claim, and is claimed in one round trip instead of a read
		// and a create. Create is create-if-absent (or if deleted), so
		// an existing claim refuses it, and is read and judged below as
		// before. (Fleet performance, issue 9: one server request less
		// per ask; the claim itself is unchanged.)
		rev, err := c.kv.Create(ctx, c.key, mustJSON(mine))
		switch {
		case err == nil:
			c.rev, c.v = rev, mine
			return c, claimed, nil
		case !errors.Is(err, jetstream.ErrKeyExists):
			return c, claimFailed, fmt.Errorf("claiming ask %s: %w", id, err)
		}
		e, err := c.kv.Get(ctx, c.key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			continue // deleted since: create again
		case err != nil:
			return c, claimFailed, fmt.Errorf("reading the claim of ask %s: %w", id, err)
		}
		var old askClaim
		_ = json.Unmarshal(e.Value(), &old)
		switch {
		case old.Done != "":
			c.v = old
			return c, claimDone, nil
		case old.Holder != "" && now.Before(old.Until) && (old.Holder != a.cfg.Machine || a.running.has(id)):
			// Alive, and another machine's, or another slot's here.
			c.v = old
			return c, claimHeld, nil
		}
		mine.InfraSince = old.InfraSince
		rev, err = c.kv.Update(ctx, c.key, mustJSON(mine), e.Revision())
		if err != nil {
			continue // changed under us: look again
		}
		c.rev, c.v = rev, mine
		return c, claimed, nil
	}
	return c, claimFailed, fmt.Errorf("claiming ask %s: it kept changing", id)
}

// claimLease is the lease of an ask's claim: lease when set, else
// claimLeasePerAckWait of the holders' ack waits (of mesh.HolderAckWait
// when the consumer has none).
func claimLease(lease, ackWait time.Duration) time.Duration {
	switch {
	case lease > 0:
		return lease
	case ackWait > 0:
		return claimLeasePerAckWait * ackWait
	}
	return claimLeasePerAckWait * mesh.HolderAckWait
}

// claimLeasePerAckWait is the default lease in ack waits. A redelivered ask
// means its holder was silent for an ack wait — dead, or cut off by a bus
// outage (a restarted server redelivers at once what waited longer than the
// ack wait). The lease is what tells the two apart: a holder that comes back
// within it renews its claim and keeps its ask, so it is the longest outage
// a build survives without being built twice, and also how long a killed
// holder's ask waits. Four ack waits (2m by default) favour built-once.
const claimLeasePerAckWait = 4

// renewEvery is how often a working slot renews its ask's claim: a third
// of the lease, so that two renewals may fail (a bus slow or away) before
// it lapses.
func renewEvery(lease time.Duration) time.Duration {
	return lease / 3
}

// write stores v as the claim's value, if it is still ours. A write whose
// answer was lost (it timed out on a slow bus, yet the server applied it)
// leaves the claim at a revision this holder did not see: the claim is
// read again, and if it is still this holder's the write is made at the
// revision read, so a renewal never lapses for an answer that was lost.
func (c *claim) write(ctx context.Context, v askClaim) error {
	if c.kv == nil {
		c.v = v
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	data := mustJSON(v)
	rev, err := c.kv.Update(ctx, c.key, data, c.rev)
	if err != nil && ctx.Err() == nil {
		e, gerr := c.kv.Get(ctx, c.key)
		var now askClaim
		switch {
		case gerr != nil:
		case bytes.Equal(e.Value(), data):
			rev, err = e.Revision(), nil // this very write, applied
		case e.Revision() > c.rev && c.v.Holder != "" && json.Unmarshal(e.Value(), &now) == nil && now.Holder == c.v.Holder && now.Done == "":
			// Ours still: a write of this holder's the answer of which
			// was lost. Made again at the revision it left.
			rev, err = c.kv.Update(ctx, c.key, data, e.Revision())
		}
	}
	if err != nil {
		return fmt.Errorf("writing the claim of %s: %w", c.key, err)
	}
	c.rev, c.v = rev, v
	return nil
}

// renew extends the claim by lease from now.
func (c *claim) renew(ctx context.Context, lease time.Duration) error {
	v := c.v
	v.Until = time.Now().Add(lease)
	return c.write(ctx, v)
}

// release gives the claim up (the ask goes back to the queue), keeping
// when its infrastructure failures began.
func (c *claim) release(ctx context.Context) error {
	v := c.v
	v.Holder, v.Until = "", time.Time{}
	return c.write(ctx, v)
}

// done marks the ask's outcome announced.
func (c *claim) done(ctx context.Context, outcome string) error {
	v := c.v
	v.Done = outcome
	return c.write(ctx, v)
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}
