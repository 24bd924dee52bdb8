package meshtest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// Claims timestamps, by ask, when a machine's first claim of it was
// stored in the build seat's ask claims bucket (a watch of the bucket):
// the moment the ask was dispatched, its machine holding it. Benchmarks
// measure dispatch to it, as a build begins only once its claim is
// stored; a build's started is announced later, and not at all for one
// shorter than the agent's StartedDelay.
type Claims struct {
	mu      sync.Mutex
	claimed map[string]time.Time
	notify  chan struct{}
	stop    func()
}

// WatchClaims watches the build seat's ask claims bucket until Stop, or tb
// ends.
func WatchClaims(tb testing.TB, js jetstream.JetStream) *Claims {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	kv, err := js.KeyValue(ctx, mesh.AskClaimsBucket(mesh.BuildSeat))
	if err != nil {
		tb.Fatal(err)
	}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		tb.Fatal(err)
	}
	c := &Claims{claimed: map[string]time.Time{}, notify: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			at := time.Now()
			i := strings.LastIndexByte(e.Key(), '.') // mesh.AskClaimKey: <ask>.<machine>
			if i < 0 {
				continue
			}
			ask := e.Key()[:i]
			c.mu.Lock()
			if _, seen := c.claimed[ask]; !seen {
				c.claimed[ask] = at
			}
			c.mu.Unlock()
			select {
			case c.notify <- struct{}{}:
			default:
			}
		}
	}()
	var once sync.Once
	c.stop = func() {
		once.Do(func() {
			_ = w.Stop()
			cancel()
			<-done
		})
	}
	tb.Cleanup(c.stop)
	return c
}

// Stop ends the watch: its consumer costs the server a delivery per claim
// written (two per build).
func (c *Claims) Stop() { c.stop() }

// Wait returns when ask was first claimed, waiting at most d for it.
func (c *Claims) Wait(tb testing.TB, ask string, d time.Duration) time.Time {
	tb.Helper()
	deadline := time.After(d)
	for {
		c.mu.Lock()
		at, ok := c.claimed[ask]
		c.mu.Unlock()
		if ok {
			return at
		}
		select {
		case <-c.notify:
		case <-deadline:
			tb.Fatalf("ask %s: no machine claimed it within %s", ask, d)
		}
	}
}
