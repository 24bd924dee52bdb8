package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/registry"
)

// A controller that no longer holds its seat does nothing outside the plan
// store either (whose writes, and the asks' publishing, were already
// refused): it pushes no image index (nor tags it latest), deletes no ask
// from the queue and asks no holder to cancel. A controller woken after its
// seat was taken (stopped with SIGSTOP, cut off) ran one turn before its
// flush saw the seat lost, and that turn's tick pushed the indexes of the
// plans it knew, tagging latest. The same calls on a controller that holds
// its seat do each (so the test can fail).
func TestAControllerThatLostItsSeatTouchesNothingOutsideTheStore(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("lost=%v", lost), func(t *testing.T) {
			var registryHits atomic.Int32
			reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				registryHits.Add(1)
				http.NotFound(w, r)
			}))
			defer reg.Close()
			s := natstest.Server(t, nil)
			nc, js := natstest.Connect(t, s)
			ctx := context.Background()
			cat := meshtest.Catalogue(t, map[string][]string{"a": nil})
			if _, err := mesh.Raise(ctx, js, cat, 1); err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.Registry = strings.TrimPrefix(reg.URL, "http://")
			cfg.RegistryClient = registry.NewClient(registry.WithInsecure(true))
			c, err := New(cfg, js, cat, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if lost {
				c.SetHeld(func() error { return fmt.Errorf("%w: no renewal within the lease", claim.ErrLost) })
			}

			// A module of two platforms, both built: its index is due.
			st := twoPlatforms(t)
			base := byModule(t, st.Start(at(0)), "base")
			for i, p := range []string{"linux/amd64", "linux/arm64"} {
				ev := built(base, 2+i)
				ev.Ask, ev.Digest = platformEvent(base, p), "sha256:"+strings.Repeat(string(rune('a'+i)), 64)
				st.Built(ev, at(2+i))
			}
			if len(st.Unindexed()) != 1 {
				t.Fatalf("unindexed %+v, want base's index due", st.Unindexed())
			}
			c.plans[st.Plan] = st
			c.assemble(ctx, true)
			if n := registryHits.Load(); (n > 0) == lost {
				t.Errorf("lost %v: the registry was asked %d times for base's index", lost, n)
			}

			// An ask in the queue, withdrawn.
			ask := mesh.Ask{Version: mesh.AskVersion, ID: "p-1-a-1", Plan: "p-1", Module: "a", Platform: mesh.DefaultPlatform}
			data, _ := json.Marshal(ask)
			pa, err := js.Publish(ctx, mesh.BuildShardSubject(mesh.DefaultPlatform, 0), data)
			if err != nil {
				t.Fatal(err)
			}
			c.askSeq[ask.ID] = pa.Sequence
			c.withdraw(ctx, st, []string{ask.ID}, time.Now())
			stream, err := js.Stream(ctx, mesh.SeatStream(mesh.BuildSeat))
			if err != nil {
				t.Fatal(err)
			}
			_, err = stream.GetMsg(ctx, pa.Sequence)
			if deleted := err != nil; deleted == lost {
				t.Errorf("lost %v: the ask was deleted from the queue: %v", lost, deleted)
			}

			// The holders asked to cancel.
			sub, err := nc.SubscribeSync(mesh.SeatToolSubject(mesh.BuildSeat, mesh.CancelTool))
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			c.cancelOnHolders([]string{ask.ID})
			_, err = sub.NextMsg(time.Second)
			if asked := err == nil; asked == lost {
				t.Errorf("lost %v: the holders were asked to cancel: %v", lost, asked)
			}
		})
	}
}
