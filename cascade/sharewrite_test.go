package cascade_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/sim"
)

// A plan with more modules waiting than a flush stores (shares of them
// stored beside the loop) ends with every module stored built — a share
// landing over a module released meanwhile would leave it stored waiting
// (the bucket keeps a key's last value) — and, as a watch of the store saw
// it, no module was stored waiting after a later state.
func TestWaitingSharesNeverOverwriteANewerState(t *testing.T) {
	d := sim.RandomLayeredDAG(1500, 6, 2) // 250 a tier: 1,250 waiting at first
	zero := d
	zero.Dur = make([]float64, d.Len())
	f := newBenchFarm(t, benchCatalogue(t, d), cascade.DefaultConfig(), 6, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := cascade.OpenStore(ctx, f.js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
	w, err := st.KV().Watch(ctx, cascade.ModuleKey("*", "*"), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	seen := map[string][]cascade.ModuleState{}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for e := range w.Updates() {
			var ms cascade.ModuleStatus
			if e != nil && json.Unmarshal(e.Value(), &ms) == nil {
				seen[e.Key()] = append(seen[e.Key()], ms.State)
			}
		}
	}()
	r := f.run(zero, 0, 2*time.Minute)
	time.Sleep(500 * time.Millisecond) // the watch's last deliveries
	_ = w.Stop()
	<-watched
	mods, err := st.Modules(ctx, r.Rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range d.Names {
		if got := mods[m].State; got != cascade.Built {
			t.Errorf("%s: stored %s at the end, want built", m, got)
		}
	}
	waitingFirst := 0
	for k, states := range seen {
		moved := false
		for i, s := range states {
			switch {
			case s == cascade.Waiting && moved:
				t.Errorf("%s: stored waiting after a later state (%v)", k, states)
			case s == cascade.Waiting && i == 0:
				waitingFirst++
			case s != cascade.Waiting:
				moved = true
			}
		}
	}
	// The shares ran: more modules were stored waiting than one flush
	// stores.
	if waitingFirst <= 256 {
		t.Errorf("%d of %d modules were seen stored waiting; want more than a flush's 256 (the shares beside the loop)", waitingFirst, len(seen))
	}
	t.Logf("%d modules, %d seen stored waiting first", len(seen), waitingFirst)
}
