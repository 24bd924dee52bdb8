package cascade

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// A write of a module whose waiting state is being stored beside the loop
// waits for that share: the newer state is stored last, not overwritten
// by the waiting one landing after it.
func TestANewerStateWaitsForTheShareInFlight(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: mesh.KVBucket("mesh-controller", StateBucket)}); err != nil {
		t.Fatal(err)
	}
	store, err := OpenStore(ctx, js, "mesh-controller")
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	c := &Controller{store: store, writeShare: func(ctx context.Context, share map[string]any) error {
		<-gate
		return store.Put(ctx, share)
	}}
	key := ModuleKey("p1", "m")
	c.storeShare(ctx, map[string]any{key: ModuleStatus{Module: "m", State: Waiting}, ModuleKey("p1", "n"): ModuleStatus{Module: "n", State: Waiting}})
	done := make(chan error, 1)
	go func() { done <- c.persist(ctx, map[string]any{key: ModuleStatus{Module: "m", State: Queued}}) }()
	select {
	case err := <-done:
		t.Fatalf("the newer state was stored (%v) while the share holding the waiting one was still being written", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c.sharing != nil {
		t.Fatal("the share's answer was not taken")
	}
	e, err := store.KV().Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var got ModuleStatus
	if err := json.Unmarshal(e.Value(), &got); err != nil {
		t.Fatal(err)
	}
	if got.State != Queued {
		t.Fatalf("stored %s, want queued (the newer state)", got.State)
	}
	// A write of other keys does not wait for a share.
	gate = make(chan struct{})
	defer close(gate)
	c.storeShare(ctx, map[string]any{ModuleKey("p1", "o"): ModuleStatus{Module: "o", State: Waiting}})
	if err := c.persist(ctx, map[string]any{ModuleKey("p1", "q"): ModuleStatus{Module: "q", State: Queued}}); err != nil {
		t.Fatal(err)
	}
	if c.sharing == nil {
		t.Fatal("a write of other keys waited for the share")
	}
}
