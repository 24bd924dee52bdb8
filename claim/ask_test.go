package claim_test

import (
	"context"
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
	l, err := a.Claim(ctx, "ask-1", 1, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// Held across several leases while m1 renews, as m2 sees it.
	for range 3 {
		f, err := b.Look(ctx, "ask-1", func(claim.AskRecord) bool { return false })
		if err != nil || f.Held == nil || f.Held.Machine != "m1" {
			t.Fatalf("m2 sees %+v (%v), want held by m1", f, err)
		}
		time.Sleep(time.Second)
	}
	// m1 stalls (its connection goes; nothing renews): within the lease
	// (and a loaded machine's margin) the claim is gone on the server.
	nc1js.Conn().Close()
	testenv.WaitFor(t, 2*time.Second+5*time.Second, "m1's claim to lapse", func() bool {
		f, err := b.Look(ctx, "ask-1", func(claim.AskRecord) bool { return false })
		return err == nil && f.Held == nil
	})
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("m1's lease did not say it was lost")
	}
	if _, err := b.Claim(ctx, "ask-1", 2, time.Time{}); err != nil {
		t.Fatal(err)
	}
}
