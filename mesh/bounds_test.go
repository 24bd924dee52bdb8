package mesh_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// The bounds the mesh derives hold on a real server under the derived
// permissions: the seat's consumer gives up on an ask after
// HolderMaxDeliver deliveries, its holders claim asks in the bucket they
// share (and the shop, a user of the seat, cannot), and the controller
// hears when the server gives up on an ask.
func TestTheSeatsBoundsUnderDerivedPermissions(t *testing.T) {
	c := mesh.NewCatalogue(fixture())
	_, connect := principals(t, c)
	cnc, cjs, _ := connect("controller")
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
	adv := mesh.MaxDeliveriesAdvisory(mesh.SeatStream(mesh.BuildSeat), "*")
	if _, err := cnc.SubscribeSync(adv); err != nil {
		t.Fatal(err)
	}
	if err := cnc.Flush(); err != nil || cnc.LastError() != nil {
		t.Fatalf("the controller subscribing to %s: %v %v", adv, err, cnc.LastError())
	}

	bucket := mesh.AskClaimsBucket(mesh.BuildSeat)
	_, js, _ := connect("build-agent")
	kv, err := js.KeyValue(ctx(t), bucket)
	if err != nil {
		t.Fatalf("a holder binding %s: %v", bucket, err)
	}
	rev, err := kv.Create(ctx(t), mesh.AskClaimKey("p-1-a-1"), []byte(`{"holder":"m1"}`))
	if err != nil {
		t.Fatalf("a holder claiming an ask: %v", err)
	}
	if _, err := kv.Update(ctx(t), mesh.AskClaimKey("p-1-a-1"), []byte(`{"holder":"m1","done":"built"}`), rev); err != nil {
		t.Fatalf("a holder renewing its claim: %v", err)
	}
	if _, err := kv.Create(ctx(t), mesh.AskClaimKey("p-1-a-1"), []byte(`{"holder":"m2"}`)); err == nil {
		t.Fatal("a second claim of the same ask was created")
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
