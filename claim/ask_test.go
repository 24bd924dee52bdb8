package claim_test

import (
	"context"
	"encoding/json"
	"maps"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// askBus is bus with the build seat's ask claims bucket raised.
func askBus(t *testing.T) func() jetstream.JetStream {
	t.Helper()
	_, dial := bus(t)
	_, js := dial()
	seat := mesh.Seat{Seat: mesh.BuildSeat, Scope: mesh.ScopeNode, Accepts: []string{"build retain 1h"}}
	if _, err := js.CreateOrUpdateKeyValue(context.Background(), mesh.AskClaimsBucketSpec(seat, 1).Config); err != nil {
		t.Fatal(err)
	}
	return func() jetstream.JetStream { _, js := dial(); return js }
}

// Ask claims are judged on the server's clock alone (issue 20): a holder
// whose clock is ten minutes slow, stalled past its lease, loses the ask
// to a machine whose clock is ten minutes fast, at the lease, and that
// machine, while the first holds it, sees it held whatever either clock
// says. No clock reading decides.
func TestAskClaimsAreJudgedOnTheServersClock(t *testing.T) {
	dial := askBus(t)
	ctx := context.Background()
	slow := func() time.Time { return time.Now().Add(-10 * time.Minute) }
	fast := func() time.Time { return time.Now().Add(10 * time.Minute) }
	lease := claim.WithLease(2 * time.Second)

	nc1js := dial()
	a, err := claim.OpenAsks(ctx, nc1js, mesh.BuildSeat, "m1", "slow", "", lease, claim.WithClock(slow))
	if err != nil {
		t.Fatal(err)
	}
	b, err := claim.OpenAsks(ctx, dial(), mesh.BuildSeat, "m2", "fast", "", lease, claim.WithClock(fast))
	if err != nil {
		t.Fatal(err)
	}
	l, err := a.Claim(ctx, "ask-1", "", 1, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	// Held across several leases while m1 renews, as m2 sees it.
	for range 3 {
		f, err := b.Look(ctx, "ask-1", "")
		if err != nil || f.Held == nil || f.Held.Machine != "m1" {
			t.Fatalf("m2 sees %+v (%v), want held by m1", f, err)
		}
		time.Sleep(time.Second)
	}
	// m1 stalls (its connection goes; nothing renews): within the lease
	// (and a loaded machine's margin) the claim is gone on the server.
	nc1js.Conn().Close()
	testenv.WaitFor(t, 2*time.Second+5*time.Second, "m1's claim to lapse", func() bool {
		f, err := b.Look(ctx, "ask-1", "")
		return err == nil && f.Held == nil
	})
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("m1's lease did not say it was lost")
	}
	if _, err := b.Claim(ctx, "ask-1", "", 2, time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
}

// A settled claim written as its lease ran out can be removed after it by
// the server's marker of the lease's end, committed later (seen after a
// three-server cluster regained quorum: the controller then found no claim
// and refused the genuine outcome). The holder looks again once the lease
// has passed and writes it again. Here the marker comes as a purge of the
// key just after the settle landed.
func TestASettledClaimRemovedAfterItIsWrittenAgain(t *testing.T) {
	dial := askBus(t)
	ctx := context.Background()
	js := dial()
	// Renewed late (every 3s of a 4s lease), so that the outcome is
	// settled in the lease's second half, as after an outage.
	a, err := claim.OpenAsks(ctx, js, mesh.BuildSeat, "m1", "test", "", claim.WithLease(4*time.Second), claim.WithRenew(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := a.Claim(ctx, "ask-1", "", 1, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2200 * time.Millisecond)
	kv := a.Bucket()
	key := mesh.AskClaimKey("ask-1", "m1")
	purged := make(chan error, 1)
	go func() {
		for {
			rec, ok, err := claim.ReadAsk(ctx, js, kv, "ask-1", "m1")
			if err != nil {
				purged <- err
				return
			}
			if ok && rec.Outcome != "" {
				purged <- kv.Purge(ctx, key)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if err := l.Announce(ctx, mesh.EventBuilt, "ask-1-built-x", []byte(`{"ask":"ask-1"}`)); err != nil {
		t.Fatal(err)
	}
	if err := <-purged; err != nil {
		t.Fatal(err)
	}
	rec, ok, err := claim.ReadAsk(ctx, js, kv, "ask-1", "m1")
	if err != nil || !ok || rec.Outcome != mesh.EventBuilt || rec.MsgID != "ask-1-built-x" {
		t.Fatalf("m1's claim after the settle returned: %+v found=%v (%v), want built under ask-1-built-x", rec, ok, err)
	}
}

// Any machine may write its own claim of any ask. Claims that do not carry
// their machine's proof of delivery — one held, one settled with a made-up
// outcome, one with an old infrastructure budget — are passed over by a
// machine that looks with the ask's secret: it finds m1's claim held (m1
// was delivered the ask), no outcome, no budget spent and m1's attempt.
// Once m1 settles, its own outcome is found.
func TestClaimsWithoutAProofOfDeliveryArePassedOver(t *testing.T) {
	dial := askBus(t)
	ctx := context.Background()
	const secret, ask = "the-asks-secret", "ask-1"
	m1, err := claim.OpenAsks(ctx, dial(), mesh.BuildSeat, "m1", "agent", "")
	if err != nil {
		t.Fatal(err)
	}
	l, err := m1.Claim(ctx, ask, secret, 2, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	kv := m1.Bucket()
	now := time.Now().UTC()
	for machine, rec := range map[string]claim.AskRecord{
		"m2": {Ask: ask, Machine: "m2", Attempt: 5, Since: now, Renewed: now, Lease: "1h", Token: "x"},
		"m3": {Ask: ask, Machine: "m3", Attempt: 1, Outcome: mesh.EventBuilt, MsgID: "forged", Event: json.RawMessage(`{"digest":"sha256:old"}`),
			Proof: mesh.AskProof("a guess", ask, "m3")},
		"m4": {Ask: ask, Machine: "m4", Attempt: 1, Released: "infra", InfraSince: now.Add(-time.Hour), Proof: mesh.AskProof(secret, ask, "m1")},
	} {
		data, _ := json.Marshal(rec)
		if _, err := kv.Put(ctx, mesh.AskClaimKey(ask, machine), data); err != nil {
			t.Fatal(err)
		}
	}
	other, err := claim.OpenAsks(ctx, dial(), mesh.BuildSeat, "m5", "agent", "")
	if err != nil {
		t.Fatal(err)
	}
	f, err := other.Look(ctx, ask, secret)
	if err != nil {
		t.Fatal(err)
	}
	if f.Held == nil || f.Held.Machine != "m1" || f.Done != nil || !f.InfraSince.IsZero() || f.Attempts != 2 {
		t.Fatalf("looked with the secret: %+v, want m1's claim held, nothing done, no budget spent, attempt 2", f)
	}
	// Without the secret every claim counts (asks that carry none).
	if f, _ := other.Look(ctx, ask, ""); f.Done == nil || f.Attempts != 5 {
		t.Fatalf("looked with no secret: %+v, want every claim counted", f)
	}
	if err := l.Announce(ctx, mesh.EventBuilt, "ask-1-built-m1", []byte(`{"ask":"ask-1"}`)); err != nil {
		t.Fatal(err)
	}
	f, err = other.Look(ctx, ask, secret)
	if err != nil || f.Done == nil || f.Done.Machine != "m1" || f.Done.MsgID != "ask-1-built-m1" || f.Held != nil {
		t.Fatalf("after m1 settled: %+v (%v), want m1's outcome", f, err)
	}
}

// A holder that takes a machine's seat after another died finds the claims
// that one left (Left): those bound to its seat claim's token, held or
// settled with an outcome (announced, perhaps not acknowledged), with the
// reply of the delivery each was made for; not a claim it handed back, nor
// one bound to another seat claim, nor another machine's.
func TestLeftFindsTheHeldClaimsOfAPreviousSeatClaim(t *testing.T) {
	dial := askBus(t)
	ctx := context.Background()
	js := dial()
	if err := mesh.RaiseClaims(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	lease := claim.WithLease(time.Minute)
	open := func(machine, seat string) *claim.Asks {
		t.Helper()
		a, err := claim.OpenAsks(ctx, dial(), mesh.BuildSeat, machine, "agent", seat, lease)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	before, other, m2 := open("m1", "seat-before"), open("m1", "seat-other"), open("m2", "seat-before")
	claimed := func(a *claim.Asks, ask, reply string) *claim.AskLease {
		t.Helper()
		l, err := a.Claim(ctx, ask, "", 1, time.Time{}, reply)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	claimed(before, "ask-held", "$JS.ACK.held")
	claimed(before, "ask-held-2", "$JS.ACK.held-2")
	if err := claimed(before, "ask-built", "$JS.ACK.built").Finish(ctx, mesh.EventBuilt); err != nil {
		t.Fatal(err)
	}
	if err := claimed(before, "ask-back", "$JS.ACK.back").Release(ctx, "handed back", time.Time{}); err != nil {
		t.Fatal(err)
	}
	claimed(other, "ask-other-seat", "$JS.ACK.other")
	claimed(m2, "ask-m2", "$JS.ACK.m2")

	now := open("m1", "seat-now")
	left, err := now.Left(ctx, "seat-before")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range left {
		got[r.Ask] = r.Reply
	}
	// Held, or settled with an outcome (perhaps not acknowledged); not
	// handed back (given back with its own delay).
	want := map[string]string{"ask-held": "$JS.ACK.held", "ask-held-2": "$JS.ACK.held-2", "ask-built": "$JS.ACK.built"}
	if !maps.Equal(got, want) {
		t.Fatalf("Left found %v, want %v", got, want)
	}
	if left, err := now.Left(ctx, ""); err != nil || len(left) != 0 {
		t.Fatalf("Left of no seat claim: %v (%v), want nothing", left, err)
	}
}

// A claim whose machine's seat claim lapsed is void, not held (another
// machine may build the ask), and Look says so apart (SeatLapsed): its
// holder may be alive, its seat lapsed in an outage every seat claim
// lapsed in. A claim whose machine's seat is another claim's now (the
// machine's agent restarted) is void and nothing more.
func TestLookTellsAClaimWhoseSeatLapsedFromOneWhoseSeatIsAnothers(t *testing.T) {
	dial := askBus(t)
	ctx := context.Background()
	js := dial()
	if err := mesh.RaiseClaims(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	seat, err := claim.Claim(ctx, js, mesh.BuildSeat, claim.Node("m1"), claim.Process("build-agent"), claim.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	m1, err := claim.OpenAsks(ctx, dial(), mesh.BuildSeat, "m1", "agent", seat.Token())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m1.Claim(ctx, "ask-1", "", 1, time.Time{}, ""); err != nil {
		t.Fatal(err)
	}
	// m2's claims are bound to a seat claim of its own: it judges the
	// others' so.
	m2, err := claim.OpenAsks(ctx, dial(), mesh.BuildSeat, "m2", "agent", "m2-seat")
	if err != nil {
		t.Fatal(err)
	}
	look := func() claim.AskFound {
		t.Helper()
		f, err := m2.Look(ctx, "ask-1", "")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if f := look(); f.Held == nil || f.Held.Machine != "m1" || f.SeatLapsed != nil {
		t.Fatalf("with m1's seat held: %+v, want m1's claim held", f)
	}
	if err := seat.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if f := look(); f.Held != nil || f.SeatLapsed == nil || f.SeatLapsed.Machine != "m1" || f.Attempts != 1 {
		t.Fatalf("with m1's seat claim gone: %+v, want m1's claim void, its seat lapsed", f)
	}
	if _, err := claim.Claim(ctx, js, mesh.BuildSeat, claim.Node("m1"), claim.Process("build-agent"), claim.WithLease(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if f := look(); f.Held != nil || f.SeatLapsed != nil || f.Attempts != 1 {
		t.Fatalf("with m1's seat another claim's: %+v, want m1's claim void and nothing more", f)
	}
}
