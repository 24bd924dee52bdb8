package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/mesh"
)

// The default claim lease is three quarters of the holders' ack wait: a
// dead agent's ask is built elsewhere within about the ack wait.
func TestTheDefaultClaimLeaseIsInsideTheAckWait(t *testing.T) {
	if l := agent.DefaultConfig().ClaimLease; l != 0 {
		t.Fatalf("default claim lease %s, want 0 (three quarters of the consumer's ack wait, %s)", l, mesh.HolderAckWait)
	}
	if err := agent.DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	c := agent.DefaultConfig()
	c.ClaimLease = 500 * time.Millisecond
	if err := c.Validate(); err == nil {
		t.Fatal("a claim lease of 500ms was accepted, want it refused")
	}
}

// A working holder renews its ask's claim every third of the lease, even
// with no heartbeat due, and a renewal whose answer was lost (the claim's
// revision moved while the value is still the holder's) does not make it
// lapse: the redelivered ask is left to its holder all along, and built
// once.
func TestAClaimIsRenewedWithinItsLeaseEvenWhenAnAnswerIsLost(t *testing.T) {
	s, js := bus(t)
	g := newGate()
	// No heartbeat (as if the InProgress were lost): the server redelivers
	// the ask every ack wait; only the claim, renewed every third of its
	// lease, keeps it with m1.
	startAgent(t, s, "m1", g.on("m1"), func(c *agent.Config) { c.Heartbeat = time.Hour })
	submit(t, js, ask("kept"))
	if id := recv(t, g.began, 5*time.Second); id != "kept" {
		t.Fatalf("began %s", id)
	}
	ended := make(ends, 100)
	startObserved(t, s, "m2", g.on("m2"), nil, ended)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, mesh.AskClaimsBucket(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	// A renewal whose answer was lost: the server holds a revision the
	// holder did not see, with its own value.
	e, err := kv.Get(ctx, mesh.AskClaimKey("kept", "m1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, mesh.AskClaimKey("kept", "m1"), e.Value()); err != nil {
		t.Fatal(err)
	}
	// Three ack waits: m2 is handed the ask again and again
	// and leaves it each time.
	ended.next(t, agent.OutcomeHandedBack, 3*testAckWait)
	deadline := time.Now().Add(3 * testAckWait)
	for time.Now().Before(deadline) {
		select {
		case id := <-g.began:
			t.Fatalf("%s was taken by another while its holder worked on it", id)
		case <-time.After(time.Until(deadline)):
		}
	}
	g.ch("kept") <- nil
	if r := builtOnce(t, js, 10*time.Second, "kept built and acknowledged"); len(r.Built) != 1 || r.Built[0].On != "m1" || len(r.Started) != 1 {
		t.Fatalf("started %+v built %+v: want one start and one built, on m1", r.Started, r.Built)
	}
}

// An ask queued before the agent started may have been delivered before,
// whatever its delivery count says: a farm started again whole, on a
// cluster that kept its holders' consumer's state in memory
// (mesh.HolderStateInMemory), delivers the asks it had in hand again
// counting from one. So the agent reads the ask's claims before claiming
// it: one whose outcome another machine recorded before the stop (and
// never acknowledged) is announced again under the recorded id, not built.
func TestAnAskQueuedBeforeTheAgentStartedIsLookedUpBeforeItIsBuilt(t *testing.T) {
	s, js := bus(t)
	ctx := context.Background()
	a := ask("recorded")
	submit(t, js, a)
	// m1 built it and recorded its outcome in its claim before the stop.
	m1, err := claim.OpenAsks(ctx, js, mesh.BuildSeat, "m1", "build-agent", "")
	if err != nil {
		t.Fatal(err)
	}
	l, err := m1.Claim(ctx, a.ID, a.Secret, 1, time.Time{}, "")
	if err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	ev, _ := json.Marshal(mesh.Built{Version: mesh.AskVersion, Ask: a.ID, Plan: a.Plan, Module: a.Module, Commit: a.Source.Commit,
		Digest: digest, Image: a.Image + "@" + digest, On: "m1", Attempt: 1, At: time.Now().UTC()})
	if err := l.Announce(ctx, mesh.EventBuilt, a.ID+"-built-recorded", ev); err != nil {
		t.Fatal(err)
	}

	g := newGate()
	ended := make(ends, 10)
	startObserved(t, s, "m2", g.on("m2"), nil, ended)
	ended.next(t, agent.OutcomeDone, 10*time.Second)
	g.notBegunAgain(t)
	r := builtOnce(t, js, 10*time.Second, "the recorded built announced again and the ask acknowledged")
	if b := r.Built[0]; b.Digest != digest || b.On != "m2" {
		t.Fatalf("built %+v, want m1's recorded digest %s announced by m2", b, digest)
	}
}
