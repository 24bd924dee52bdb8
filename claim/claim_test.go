package claim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// lease is short so that a lapse is seen in a test; the server counts whole
// seconds.
var short = []claim.Option{claim.WithLease(time.Second)}

// bus starts a server with the claims bucket raised, and returns a dialer:
// each call is a process of its own, with its own connection.
func bus(t *testing.T) (*server.Server, func() (*nats.Conn, jetstream.JetStream)) {
	t.Helper()
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	if err := mesh.RaiseClaims(context.Background(), js, 1); err != nil {
		t.Fatal(err)
	}
	return s, func() (*nats.Conn, jetstream.JetStream) { return natstest.Connect(t, s) }
}

// claimAsA claims mesh-controller's seat (mesh scope) on js as holder A,
// with opts, failing the test if it cannot.
func claimAsA(t *testing.T, js jetstream.JetStream, opts ...claim.Option) *claim.Lease {
	t.Helper()
	a, err := claim.Claim(context.Background(), js, "mesh-controller", claim.Mesh(), "A", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// aHolds starts a bus and two processes on it, the first of which claims
// the seat as A (claimAsA) with opts: A's lease, the first process's
// connection, and the second's JetStream.
func aHolds(t *testing.T, opts ...claim.Option) (*claim.Lease, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	_, dial := bus(t)
	nc1, js1 := dial()
	_, js2 := dial()
	return claimAsA(t, js1, opts...), nc1, js2
}

func release(t *testing.T, l *claim.Lease) {
	t.Cleanup(func() { _ = l.Release(context.Background()) })
}

func TestOneHolderASecondClaimIsRefusedNamingIt(t *testing.T) {
	_, dial := bus(t)
	ctx := context.Background()
	_, js1 := dial()
	_, js2 := dial()
	a, err := claim.Claim(ctx, js1, "mesh-controller", claim.Mesh(), "controller A", short...)
	if err != nil {
		t.Fatal(err)
	}
	release(t, a)

	_, err = claim.Claim(ctx, js2, "mesh-controller", claim.Mesh(), "controller B")
	if !errors.Is(err, claim.ErrClaimed) {
		t.Fatalf("second claim: %v, want ErrClaimed", err)
	}
	var ce *claim.ClaimedError
	if !errors.As(err, &ce) || ce.Record.Holder != "controller A" || !ce.Record.Since.Equal(a.Record().Since) {
		t.Fatalf("refusal names %+v, want controller A since %s", ce, a.Record().Since)
	}
	if !strings.Contains(err.Error(), `"controller A"`) || !strings.Contains(err.Error(), a.Record().Since.Format(time.RFC3339)) {
		t.Fatalf("refusal %q does not say who holds the seat since when", err)
	}
	if rec, ok, err := claim.Current(ctx, js2, "mesh-controller", claim.Mesh()); err != nil || !ok || rec.Holder != "controller A" {
		t.Fatalf("current holder: %+v %v %v", rec, ok, err)
	}

	// A node-scoped seat has one holder per node: m1 and m2 both hold it,
	// a second on m1 is refused.
	m1, err := claim.Claim(ctx, js1, mesh.BuildSeat, claim.Node("m1"), "agent 1")
	if err != nil {
		t.Fatal(err)
	}
	release(t, m1)
	m2, err := claim.Claim(ctx, js2, mesh.BuildSeat, claim.Node("m2"), "agent 2")
	if err != nil {
		t.Fatalf("another node's claim of the same seat: %v", err)
	}
	release(t, m2)
	if _, err := claim.Claim(ctx, js2, mesh.BuildSeat, claim.Node("m1"), "agent 3"); !errors.As(err, &ce) || ce.Record.Holder != "agent 1" {
		t.Fatalf("second holder on m1: %v", err)
	}
	// The holder keeps the seat across renewals.
	var renewed *claim.ClaimedError
	testenv.WaitFor(t, 10*time.Second, "a renewal", func() bool {
		_, err := claim.Claim(ctx, js2, "mesh-controller", claim.Mesh(), "controller B")
		return errors.As(err, &renewed) && renewed.Record.Renewed.After(renewed.Record.Since)
	})
	if a.Err() != nil {
		t.Fatalf("holder lost its claim while renewing: %v", a.Err())
	}
}

func TestAReleasedSeatIsTakenAtOnce(t *testing.T) {
	ctx := context.Background()
	a, _, js2 := aHolds(t)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(a.Err(), claim.ErrReleased) {
		t.Fatalf("Err after release: %v", a.Err())
	}
	<-a.Lost()
	b, err := claim.Claim(ctx, js2, "mesh-controller", claim.Mesh(), "B")
	if err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	release(t, b)
}

// A renewal stored while its acknowledgement was lost (or cut short by the
// release) leaves the lease a revision behind: Release still removes the
// claim, because the claim there is still this one.
func TestReleaseRemovesAClaimARevisionAhead(t *testing.T) {
	_, dial := bus(t)
	ctx := context.Background()
	_, js := dial()
	a := claimAsA(t, js)
	kv, err := js.KeyValue(ctx, mesh.ClaimsBucket())
	if err != nil {
		t.Fatal(err)
	}
	key := mesh.ClaimKey("mesh-controller", "")
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, key, e.Value(), e.Revision()); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("release a revision behind: %v", err)
	}
	if rec, ok, _ := claim.Current(ctx, js, "mesh-controller", claim.Mesh()); ok {
		t.Fatalf("released claim still there: %+v", rec)
	}
}

// A holder that dies stops renewing: its claim lapses on the server and the
// standby takes the seat within the lease, while the dead holder's Lost
// fires.
func TestAClaimLapsesWhenItsHolderDies(t *testing.T) {
	ctx := context.Background()
	a, nc1, js2 := aHolds(t, short...)
	got := make(chan *claim.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		b, err := claim.Standby(ctx, js2, "mesh-controller", claim.Mesh(), "B", short...)
		if err != nil {
			errc <- err
			return
		}
		got <- b
	}()
	// The standby is waiting while A lives.
	var ce *claim.ClaimedError
	if _, err := claim.Claim(ctx, js2, "mesh-controller", claim.Mesh(), "C", short...); !errors.As(err, &ce) || ce.Record.Holder != "A" {
		t.Fatalf("claim while A holds: %v", err)
	}
	select {
	case <-got:
		t.Fatal("the standby took a live holder's seat")
	case err := <-errc:
		t.Fatal(err)
	default:
	}

	died := time.Now()
	nc1.Close() // A dies: no more renewals.
	var b *claim.Lease
	select {
	case b = <-got:
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the standby never took the seat")
	}
	release(t, b)
	took := time.Since(died)
	if rec := b.Record(); rec.Holder != "B" {
		t.Fatalf("holder %q", rec.Holder)
	}
	// Within the lease after the last renewal, plus the server's one-second
	// expiry tick.
	if took > 3*time.Second {
		t.Errorf("takeover took %s with a 1s lease", took)
	}
	select {
	case <-a.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the dead holder's Lost never fired")
	}
	if !errors.Is(a.Err(), claim.ErrLost) {
		t.Fatalf("dead holder's Err: %v", a.Err())
	}
	t.Logf("took over %s after the holder died", took)
}

// A holder whose claim is now another's notices at its next renewal: the
// renewal is refused, Lost fires, and Err names the holder it has now.
func TestARenewalAfterLossIsNoticed(t *testing.T) {
	ctx := context.Background()
	a, _, js2 := aHolds(t, short...)
	// An operator (or a partition that outlasted the lease) took the seat
	// away: the key is removed and B claims it.
	kv, err := js2.KeyValue(ctx, mesh.ClaimsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, mesh.ClaimKey("mesh-controller", "")); err != nil {
		t.Fatal(err)
	}
	b, err := claim.Claim(ctx, js2, "mesh-controller", claim.Mesh(), "B", short...)
	if err != nil {
		t.Fatal(err)
	}
	release(t, b)
	select {
	case <-a.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the holder never noticed its claim was another's")
	}
	var ce *claim.ClaimedError
	if !errors.Is(a.Err(), claim.ErrLost) || !errors.As(a.Err(), &ce) || ce.Record.Holder != "B" {
		t.Fatalf("Err after loss: %v", a.Err())
	}
	// Releasing a lost claim leaves the new holder's alone.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if rec, ok, _ := claim.Current(ctx, js2, "mesh-controller", claim.Mesh()); !ok || rec.Holder != "B" {
		t.Fatalf("after the loser released: %+v %v", rec, ok)
	}
	if b.Err() != nil {
		t.Fatalf("the new holder lost its claim: %v", b.Err())
	}
}

// Hold runs the work only while the claim is held: a second Hold stands by,
// and runs when the first stops. A loss stops the work and stands by again.
func TestHoldRunsOneHolderAtATime(t *testing.T) {
	_, dial := bus(t)
	var running atomic.Int32
	var most atomic.Int32
	started := make(chan string, 4)
	work := func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			n := running.Add(1)
			defer running.Add(-1)
			if n > most.Load() {
				most.Store(n)
			}
			started <- name
			<-ctx.Done()
			return nil
		}
	}
	ctx1, stop1 := context.WithCancel(context.Background())
	defer stop1()
	ctx2, stop2 := context.WithCancel(context.Background())
	defer stop2()
	_, js1 := dial()
	_, js2 := dial()
	done1 := make(chan error, 1)
	done2 := make(chan error, 1)
	go func() { done1 <- claim.Hold(ctx1, js1, "mesh-controller", claim.Mesh(), "A", work("A"), short...) }()
	if who := <-started; who != "A" {
		t.Fatalf("%s started first", who)
	}
	// bStarts waits for B to start: "B never took " what, if it does not.
	bStarts := func(what string) {
		t.Helper()
		select {
		case who := <-started:
			if who != "B" {
				t.Fatalf("%s started", who)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("B never took " + what)
		}
	}
	go func() { done2 <- claim.Hold(ctx2, js2, "mesh-controller", claim.Mesh(), "B", work("B"), short...) }()
	testenv.WaitFor(t, 5*time.Second, "B to stand by", func() bool {
		_, err := claim.Claim(context.Background(), js2, "mesh-controller", claim.Mesh(), "probe", short...)
		return errors.Is(err, claim.ErrClaimed)
	})
	select {
	case who := <-started:
		t.Fatalf("%s started while A holds the seat", who)
	default:
	}
	stop1()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	bStarts("over after A stopped")

	// B loses the seat (its key taken away, C claims it): B's work stops,
	// and B stands by instead of running as a second holder.
	kv, _ := js1.KeyValue(context.Background(), mesh.ClaimsBucket())
	if err := kv.Purge(context.Background(), mesh.ClaimKey("mesh-controller", "")); err != nil {
		t.Fatal(err)
	}
	c, err := claim.Claim(context.Background(), js1, "mesh-controller", claim.Mesh(), "C", short...)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "B's work to stop", func() bool { return running.Load() == 0 })
	if err := c.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	bStarts("the seat back")
	stop2()
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
	if most.Load() != 1 {
		t.Fatalf("%d holders worked at once", most.Load())
	}
}

func TestBadClaimsAreRefusedWithTheFix(t *testing.T) {
	_, dial := bus(t)
	_, js := dial()
	ctx := context.Background()
	for name, c := range map[string]struct {
		seat   string
		scope  claim.Scope
		holder string
		opts   []claim.Option
		want   string
	}{
		"lease in parts of a second": {"mesh-controller", claim.Mesh(), "A", []claim.Option{claim.WithLease(1500 * time.Millisecond)}, "whole seconds"},
		"renew outside the lease":    {"mesh-controller", claim.Mesh(), "A", []claim.Option{claim.WithLease(time.Second), claim.WithRenew(2 * time.Second)}, "inside the lease"},
		"node with a space":          {mesh.BuildSeat, claim.Node("my box"), "A", nil, "letters, digits"},
		"no holder":                  {"mesh-controller", claim.Mesh(), "", nil, "say who claims"},
		"not a seat":                 {"Mesh.Controller", claim.Mesh(), "A", nil, "not a seat's name"},
	} {
		_, err := claim.Claim(ctx, js, c.seat, c.scope, c.holder, c.opts...)
		if !errors.Is(err, claim.ErrOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrOption saying %q", name, err, c.want)
		}
	}
}

// Every principal holding a seat claims it under its derived permissions,
// and cannot write the claim of a seat it does not hold.
func TestHoldersClaimUnderTheirDerivedPermissions(t *testing.T) {
	cat := meshtest.Catalogue(t, map[string][]string{"a": nil})
	machine, err := cat.MachinePermissions("m1")
	if err != nil {
		t.Fatal(err)
	}
	var users []*server.User
	for _, p := range []mesh.Permissions{cat.ControllerPermissions("controller"), machine} {
		users = append(users, &server.User{Username: p.Principal, Password: "pw", Permissions: p.ServerPermissions()})
	}
	s := natstest.Server(t, &server.Options{Users: users})
	violations := make(chan error, 16)
	connect := func(user string) jetstream.JetStream {
		_, js := natstest.Connect(t, s, nats.UserInfo(user, "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix(user)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case violations <- err:
				default:
				}
			}))
		return js
	}
	ctx := context.Background()
	cjs := connect("controller")
	if _, err := mesh.Raise(ctx, cjs, cat, 1); err != nil {
		t.Fatalf("raising, claims bucket included: %v", err)
	}
	c, err := claim.Claim(ctx, cjs, "mesh-controller", claim.Mesh(), "controller", short...)
	if err != nil {
		t.Fatalf("controller claiming under its grant: %v", err)
	}
	release(t, c)
	ajs := connect(mesh.PrincipalID(mesh.KindAgent, "m1"))
	a, err := claim.Claim(ctx, ajs, mesh.BuildSeat, claim.Node("m1"), "agent", short...)
	if err != nil {
		t.Fatalf("agent claiming under its grant: %v", err)
	}
	if _, err := claim.Claim(ctx, ajs, mesh.BuildSeat, claim.Node("m1"), "agent 2", short...); !errors.Is(err, claim.ErrClaimed) {
		t.Fatalf("agent reading who holds its seat: %v", err)
	}
	// Two renewals under the grant, then a release.
	testenv.WaitFor(t, 5*time.Second, "a renewal under the agent's grant", func() bool {
		rec, ok, _ := claim.Current(ctx, ajs, mesh.BuildSeat, claim.Node("m1"))
		return ok && rec.Renewed.After(rec.Since)
	})
	if err := a.Release(ctx); err != nil {
		t.Fatalf("agent releasing under its grant: %v", err)
	}
	select {
	case err := <-violations:
		t.Fatalf("a holder was refused: %v", err)
	default:
	}
	// Attack (issue 19): machine m1 writes machine m2's claim, with no TTL,
	// to lock m2 out. The server refuses it, and m2 claims its seat.
	{
		kv, err := ajs.KeyValue(ctx, mesh.ClaimsBucket())
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = kv.Put(short, mesh.ClaimKey(mesh.BuildSeat, "m2"), []byte(`{"holder":"forger"}`))
		cancel()
		if err == nil {
			t.Fatal("machine m1 wrote machine m2's claim")
		}
		if _, ok, _ := claim.Current(ctx, cjs, mesh.BuildSeat, claim.Node("m2")); ok {
			t.Fatal("m2's seat is held after m1's forged write")
		}
		drain(violations)
	}
	// The agent holds no mesh seat: it cannot claim mesh-controller.
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := claim.Claim(short, ajs, "mesh-controller", claim.Mesh(), "agent", claim.WithLease(time.Second)); err == nil {
		t.Fatal("the agent claimed a seat it does not hold")
	}
	want := mesh.KVKeySubject(mesh.ClaimsBucket(), mesh.ClaimKey("mesh-controller", ""))
	for {
		select {
		case err := <-violations:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), want) {
				return
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("no permissions violation for %s", want)
		}
	}
}

// TestHoldReturnsNilWhenStopped: Hold returns nil when its context is done,
// whatever fn said on its way out (a controller stopped while a part of it
// was still binding a consumer returned "context canceled" as its error:
// CI35, TestAStandbyControllerTakesOverMidPlan); an error fn returns while
// the seat is held is Hold's error.
func TestHoldReturnsNilWhenStopped(t *testing.T) {
	_, dial := bus(t)
	_, js := dial()
	ctx, stop := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- claim.Hold(ctx, js, "mesh-controller", claim.Mesh(), "A", func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return fmt.Errorf("binding a consumer: %w", ctx.Err())
		}, short...)
	}()
	<-started
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Hold stopped by its context = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Hold did not return after its context was done")
	}
	broke := errors.New("the catalogue is unreadable")
	err := claim.Hold(context.Background(), js, "mesh-controller", claim.Mesh(), "A", func(context.Context) error { return broke }, short...)
	if !errors.Is(err, broke) {
		t.Fatalf("Hold whose fn failed while holding = %v, want fn's error", err)
	}
}

func drain(ch chan error) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// A node's claim WithResume that lapses is claimed again under its own
// token: when its key is gone (the server expired it while the holder could
// not renew — here purged, as the expiry leaves it), the holder's next
// renewal finds it gone and writes it again, and it is never lost; a server
// restarted after an outage longer than the lease finds it claimed again
// the same way. Only another claim on the key loses it.
func TestAClaimWithResumeIsClaimedAgainAfterItLapses(t *testing.T) {
	ctx := context.Background()
	opts := server.Options{Port: natstest.FreePortRun(t, 1), StoreDir: t.TempDir()}
	s := natstest.Server(t, &opts)
	_, js1 := natstest.Connect(t, s, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err := mesh.RaiseClaims(ctx, js1, 1); err != nil {
		t.Fatal(err)
	}
	resume := []claim.Option{claim.WithLease(time.Second), claim.WithResume()}
	a, err := claim.Claim(ctx, js1, mesh.BuildSeat, claim.Node("m1"), "A", resume...)
	if err != nil {
		t.Fatal(err)
	}
	release(t, a)
	key := mesh.ClaimKey(mesh.BuildSeat, "m1")
	heldAgain := func(what string, js func() jetstream.JetStream) {
		t.Helper()
		testenv.WaitFor(t, 15*time.Second, what, func() bool {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			rec, ok, err := claim.Current(cctx, js(), mesh.BuildSeat, claim.Node("m1"))
			return err == nil && ok && rec.Token == a.Token()
		})
		select {
		case <-a.Lost():
			t.Fatalf("%s: the claim was lost: %v", what, a.Err())
		default:
		}
	}

	// The key gone on the server.
	_, js2 := natstest.Connect(t, s)
	kv, err := js2.KeyValue(ctx, mesh.ClaimsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	heldAgain("the purged claim written again", func() jetstream.JetStream { return js2 })

	// An outage three leases long.
	s.Shutdown()
	s.WaitForShutdown()
	time.Sleep(3 * time.Second)
	s = natstest.Server(t, &opts)
	var js3 jetstream.JetStream
	heldAgain("the claim written again after the outage", func() jetstream.JetStream {
		if js3 == nil {
			_, js3 = natstest.Connect(t, s)
		}
		return js3
	})
	time.Sleep(2 * time.Second) // renewed, not only written once
	heldAgain("the claim renewed after the outage", func() jetstream.JetStream { return js3 })

	// Another claim on the key (one written while A's had lapsed) loses it.
	kv, err = js3.KeyValue(ctx, mesh.ClaimsBucket())
	if err != nil {
		t.Fatal(err)
	}
	other, _ := json.Marshal(claim.Record{Seat: mesh.BuildSeat, Scope: mesh.ScopeNode, Node: "m1", Holder: "B", Lease: "10s", Token: "b-token"})
	if _, err := kv.Put(ctx, key, other); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("A never noticed B's claim")
	}
	var ce *claim.ClaimedError
	if !errors.As(a.Err(), &ce) || ce.Record.Holder != "B" {
		t.Fatalf("A's loss %v: want A lost to B", a.Err())
	}
	if rec, ok, _ := claim.Current(ctx, js3, mesh.BuildSeat, claim.Node("m1")); !ok || rec.Token != "b-token" {
		t.Fatalf("after A lost: %+v %v, want B's claim left as it is", rec, ok)
	}
}

// A holder whose bus stops answering without dropping the connection (a
// server frozen) is told so (WithTrouble) at its next renewal, and only
// then: it is how an idle machine knows that claims on that bus may have
// lapsed with their holders alive.
func TestAHolderIsToldOfABusThatStoppedAnswering(t *testing.T) {
	s, _ := bus(t)
	fz := testenv.Freeze(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	_, js := natstest.Dial(t, "nats://"+fz.Addr())
	var troubles atomic.Int32
	l := claimAsA(t, js, claim.WithLease(3*time.Second), claim.WithResume(), claim.WithTrouble(func() { troubles.Add(1) }))
	defer l.Release(context.Background())
	time.Sleep(2 * time.Second) // two renewals that are answered
	if n := troubles.Load(); n != 0 {
		t.Fatalf("told of trouble %d times while the bus answered", n)
	}
	fz.Freeze()
	testenv.WaitFor(t, 10*time.Second, "the holder told of a bus that does not answer", func() bool { return troubles.Load() > 0 })
	fz.Thaw()
	testenv.WaitFor(t, 10*time.Second, "the claim held again", func() bool {
		rec, ok, err := claim.Current(context.Background(), js, "mesh-controller", claim.Mesh())
		return err == nil && ok && rec.Token == l.Token()
	})
}

// An outage shorter than the lease with a renewal sent into it ends with
// that renewal answered late: the holder is told then (WithTrouble), once
// the bus answers again, and keeps its claim. It is how a machine that only
// waits on its pull sees an outage (a cluster without quorum) end: the asks
// whose claims lapsed in it are left to their holders a while counted from
// then (agent), not from its start.
func TestAHolderIsToldOfAnOutageWhenALateRenewalIsAnswered(t *testing.T) {
	s, _ := bus(t)
	fz := testenv.Freeze(t, strings.TrimPrefix(s.ClientURL(), "nats://"))
	_, js := natstest.Dial(t, "nats://"+fz.Addr())
	_, direct := natstest.Dial(t, s.ClientURL())
	var mu sync.Mutex
	var troubles []time.Time
	// A lease of 6 s: renewed every 2 s, given up 5 s after the last
	// renewal answered.
	l := claimAsA(t, js, claim.WithLease(6*time.Second), claim.WithTrouble(func() {
		mu.Lock()
		defer mu.Unlock()
		troubles = append(troubles, time.Now())
	}))
	defer l.Release(context.Background())
	renewed := func() time.Time {
		rec, ok, err := claim.Current(context.Background(), direct, "mesh-controller", claim.Mesh())
		if err != nil || !ok {
			return time.Time{}
		}
		return rec.Renewed
	}
	first := renewed()
	var at time.Time
	testenv.WaitFor(t, 5*time.Second, "a renewal", func() bool { at = renewed(); return at.After(first) })
	// Frozen just after a renewal: the next, 2 s after it, is sent into
	// the freeze and answered at the thaw, 1.5 s late.
	fz.Freeze()
	time.Sleep(time.Until(at.Add(3500 * time.Millisecond)))
	thawed := time.Now()
	fz.Thaw()
	testenv.WaitFor(t, 5*time.Second, "the renewal sent in the freeze stored", func() bool { return renewed().After(at) })
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	got := slices.Clone(troubles)
	mu.Unlock()
	if !slices.ContainsFunc(got, func(when time.Time) bool { return !when.Before(thawed) }) {
		t.Fatalf("told of trouble at %v, thawed at %v: want once the late renewal was answered", got, thawed)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the claim was lost in an outage shorter than its lease: %v", err)
	}
}

// A holder that checks Held before a write learns the claim is lost as soon
// as, by its own clock, a lease has passed without a renewal counted —
// before its renewing goroutine has run (a process stopped by hand for
// longer than the lease wakes with both runnable): Held says ErrLost, Lost
// is closed, and a standby takes the seat. Before that, and with the clock
// as it is, Held is nil; a released claim says so.
func TestHeldJudgesTheLeaseByThisProcesssClockAtOnce(t *testing.T) {
	ctx := context.Background()
	a, _, js2 := aHolds(t, short...)
	release(t, a)
	if err := a.Held(); err != nil {
		t.Fatalf("Held of a claim just taken: %v", err)
	}
	time.Sleep(1500 * time.Millisecond) // past a lease: renewed meanwhile
	if err := a.Held(); err != nil {
		t.Fatalf("Held of a claim renewed past its first lease: %v", err)
	}
	// The process "wakes" a lease later: its renewals have not run.
	restore := claim.SetMonotonicNow(func() time.Time { return time.Now().Add(time.Second) })
	err := a.Held()
	restore()
	if !errors.Is(err, claim.ErrLost) {
		t.Fatalf("Held a lease later by this process's clock = %v, want ErrLost", err)
	}
	select {
	case <-a.Lost():
	default:
		t.Fatal("Held said lost, and Lost is not closed")
	}
	if !errors.Is(a.Err(), claim.ErrLost) {
		t.Fatalf("Err after Held said lost = %v", a.Err())
	}
	// Its renewals stopped: the claim lapses on the server, and B has it.
	testenv.WaitFor(t, 5*time.Second, "B claims the seat", func() bool {
		b, err := claim.Claim(ctx, js2, "mesh-controller", claim.Mesh(), "B", short...)
		if err != nil {
			return false
		}
		release(t, b)
		return true
	})
	c, _, _ := aHolds(t, short...)
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Held(); !errors.Is(err, claim.ErrReleased) {
		t.Fatalf("Held of a released claim = %v, want ErrReleased", err)
	}
}
