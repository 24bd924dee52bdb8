package mesh_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// The bounds the mesh derives hold on a real server under the derived
// permissions: the seat's consumer gives up on an ask after
// HolderMaxDeliver deliveries, its holders claim asks in the bucket they
// share (and the shop, a user of the seat, cannot), and the server's word
// that it gave up on an ask is kept in the seat's GaveUpStream until the
// controller pulls and acknowledges it.
func TestTheSeatsBoundsUnderDerivedPermissions(t *testing.T) {
	c := mesh.NewCatalogue(fixture())
	_, connect := principals(t, c)
	_, cjs, _ := connect("controller")
	if _, err := mesh.Raise(ctx(t), cjs, c, 1); err != nil {
		t.Fatal(err)
	}
	cons, err := cjs.Consumer(ctx(t), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		t.Fatal(err)
	}
	if got := cons.CachedInfo().Config.MaxDeliver; got != mesh.HolderMaxDeliver {
		t.Fatalf("the seat's consumer delivers an ask %d times, want %d", got, mesh.HolderMaxDeliver)
	}
	// A real give-up: one delivery allowed, a short ack wait, an ask
	// taken by a holder and never settled.
	cfg := cons.CachedInfo().Config
	cfg.MaxDeliver, cfg.AckWait = 1, 200*time.Millisecond
	if _, err := cjs.UpdateConsumer(ctx(t), mesh.SeatStream(mesh.BuildSeat), cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := cjs.Publish(ctx(t), mesh.BuildSubject(mesh.DefaultPlatform), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_, ajs, _ := connect("m1")
	held, err := ajs.Consumer(ctx(t), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		t.Fatal(err)
	}
	b, err := held.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range b.Messages() {
		n++ // held, never settled
	}
	if n != 1 {
		t.Fatalf("the holder fetched %d asks (%v), want 1", n, b.Error())
	}
	gaveUp, err := cjs.Consumer(ctx(t), mesh.GaveUpStream(mesh.BuildSeat), mesh.GaveUpConsumer())
	if err != nil {
		t.Fatalf("the controller binding its consumer of given-up asks: %v", err)
	}
	msg, err := gaveUp.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("the server's max-deliveries advisory, kept in %s: %v", mesh.GaveUpStream(mesh.BuildSeat), err)
	}
	if !strings.Contains(string(msg.Data()), `"deliveries":1`) {
		t.Fatalf("the kept advisory says %s, want one delivery", msg.Data())
	}
	if err := msg.DoubleAck(ctx(t)); err != nil {
		t.Fatalf("the controller acknowledging a given-up ask: %v", err)
	}
	if st, err := cjs.Stream(ctx(t), mesh.GaveUpStream(mesh.BuildSeat)); err != nil || st.CachedInfo().State.Msgs != 0 {
		t.Fatalf("the advisory, worked, is still kept (%v)", err)
	}

	bucket := mesh.AskClaimsBucket(mesh.BuildSeat)
	_, js, _ := connect("m1")
	kv, err := js.KeyValue(ctx(t), bucket)
	if err != nil {
		t.Fatalf("a holder binding %s: %v", bucket, err)
	}
	rev, err := kv.Create(ctx(t), mesh.AskClaimKey("p-1-a-1", "m1"), []byte(`{"holder":"m1"}`))
	if err != nil {
		t.Fatalf("a holder claiming an ask: %v", err)
	}
	if _, err := kv.Update(ctx(t), mesh.AskClaimKey("p-1-a-1", "m1"), []byte(`{"holder":"m1","done":"built"}`), rev); err != nil {
		t.Fatalf("a holder renewing its claim: %v", err)
	}
	if _, err := kv.Create(ctx(t), mesh.AskClaimKey("p-1-a-1", "m1"), []byte(`{"holder":"m2"}`)); err == nil {
		t.Fatal("a second claim of the same key was created")
	}
	// Another machine cannot write m1's claim: its own keys only.
	_, js2, _ := connect("m2")
	if kv2, err := js2.KeyValue(ctx(t), bucket); err == nil {
		short, cancel := context.WithTimeout(ctx(t), time.Second)
		if _, err := kv2.Put(short, mesh.AskClaimKey("p-1-a-1", "m1"), []byte(`{"holder":"m2"}`)); err == nil {
			t.Fatal("machine m2 wrote m1's claim of an ask")
		}
		cancel()
	}

	_, sjs, _ := connect("shop")
	if skv, err := sjs.KeyValue(ctx(t), bucket); err == nil {
		short, cancel := context.WithTimeout(ctx(t), time.Second)
		defer cancel()
		if _, err := skv.Put(short, "p-1-a-1", []byte("{}")); err == nil {
			t.Fatal("the shop, a user of the seat, wrote an ask's claim")
		}
	} else if err == jetstream.ErrBucketNotFound {
		t.Fatal("the bucket was not raised")
	}
}
