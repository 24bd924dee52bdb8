package kvsnap

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/nats-io/nats.go/jetstream"
)

// bucket is a bucket of history 1 holding n keys, k000…, on a real server.
func bucket(t *testing.T, n int) (*Bucket, jetstream.KeyValue, []string) {
	t.Helper()
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "snap", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%03d", i)
		if _, err := kv.PutString(ctx, keys[i], "0"); err != nil {
			t.Fatal(err)
		}
	}
	return New(js, kv), kv, keys
}

// rewrite writes random keys of keys again until stop is closed.
func rewrite(t *testing.T, kv jetstream.KeyValue, keys []string, writers int, stop chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := kv.PutString(context.Background(), keys[r.Intn(len(keys))], fmt.Sprint(i)); err != nil {
					select {
					case <-stop:
					default:
						t.Errorf("put: %v", err)
					}
					return
				}
			}
		}(int64(w + 1))
	}
	return &wg
}

// markerRead is the read this package replaces: every update up to the
// watch's nil marker.
func markerRead(ctx context.Context, kv jetstream.KeyValue) (map[string]bool, error) {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	out := map[string]bool{}
	for e := range w.Updates() {
		if e == nil {
			return out, nil
		}
		out[e.Key()] = true
	}
	return out, ErrWatchEnded
}

func missing(have func(string) bool, keys []string) []string {
	var m []string
	for _, k := range keys {
		if !have(k) {
			m = append(m, k)
		}
	}
	return m
}

// TestEveryKeyWhileTheBucketIsWritten lists a bucket many times while its
// keys are being written again, and asserts each listing holds every key.
// The same reads stopped at the KeyWatcher's own nil marker leave keys out
// (logged: how many depends on the machine's speed).
func TestEveryKeyWhileTheBucketIsWritten(t *testing.T) {
	b, kv, keys := bucket(t, 200)
	stop := make(chan struct{})
	wg := rewrite(t, kv, keys, 4, stop)
	defer func() { close(stop); wg.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const reads = 60
	lostByMarker := 0
	for i := 0; i < reads; i++ {
		vals, err := b.Values(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m := missing(func(k string) bool { _, ok := vals[k]; return ok }, keys); len(m) > 0 {
			t.Fatalf("read %d: Values left out %d keys that exist: %v", i, len(m), m)
		}
		ks, err := b.Keys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) != len(keys) {
			t.Fatalf("read %d: Keys listed %d of %d keys", i, len(ks), len(keys))
		}
		for j := range ks {
			if ks[j] != keys[j] {
				t.Fatalf("read %d: Keys[%d] = %q, want %q (sorted)", i, j, ks[j], keys[j])
			}
		}
		if ls, err := b.Listed(ctx); err != nil {
			t.Fatal(err)
		} else if fmt.Sprint(ls) != fmt.Sprint(keys) {
			t.Fatalf("read %d: Listed %d keys, want the %d that exist, sorted: %v", i, len(ls), len(keys), missing(func(k string) bool { return slices.Contains(ls, k) }, keys))
		}
		if ls, err := b.Listed(ctx, keys[7], keys[2], keys[7]); err != nil {
			t.Fatal(err)
		} else if want := []string{keys[2], keys[7]}; fmt.Sprint(ls) != fmt.Sprint(want) {
			t.Fatalf("read %d: Listed under filters %s, %s, %s = %v, want %v (each key once, sorted)", i, keys[7], keys[2], keys[7], ls, want)
		}
		raw, err := markerRead(ctx, kv)
		if err != nil {
			t.Fatal(err)
		}
		lostByMarker += len(missing(func(k string) bool { return raw[k] }, keys))
	}
	t.Logf("reads stopped at the KeyWatcher's marker left out %d keys in %d reads", lostByMarker, reads)
}

// TestWatchSendsEachRevisionOnce: a watch made while keys are written gives
// every key before its marker, and after it each key's entries in the
// order of their revisions, none twice, up to the last write.
func TestWatchSendsEachRevisionOnce(t *testing.T) {
	b, kv, keys := bucket(t, 100)
	stop := make(chan struct{})
	wg := rewrite(t, kv, keys, 3, stop)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := b.Watch(ctx, []string{">"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	last := map[string]uint64{}
	var top uint64   // the highest revision received
	var final uint64 // the last revision written, once the writers stopped
	finalc := make(chan uint64, 1)
	current := false
	for final == 0 || top < final {
		select {
		case final = <-finalc:
			continue
		case e, ok := <-w.Updates():
			if !ok {
				t.Fatalf("the watch ended at revision %d of %d: %v", top, final, w.Err())
			}
			if e == nil {
				if current {
					t.Fatal("a second marker")
				}
				current = true
				if m := missing(func(k string) bool { return last[k] > 0 }, keys); len(m) > 0 {
					t.Fatalf("the marker came before %d keys: %v", len(m), m)
				}
				go func() { // a little more writing, then the end of it
					time.Sleep(200 * time.Millisecond)
					close(stop)
					wg.Wait()
					st, err := kv.Status(ctx)
					if err != nil {
						t.Error(err)
						cancel()
						return
					}
					finalc <- st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
				}()
				continue
			}
			if e.Revision() <= last[e.Key()] {
				t.Fatalf("%s: revision %d after %d", e.Key(), e.Revision(), last[e.Key()])
			}
			last[e.Key()] = e.Revision()
			top = max(top, e.Revision())
		}
	}
}

// TestDeletedKeysAreLeftOut: a deleted or purged key is not listed, a key
// put again after its deletion is; an empty bucket is an empty listing.
func TestDeletedKeysAreLeftOut(t *testing.T) {
	b, kv, _ := bucket(t, 0)
	ctx := context.Background()
	if ks, err := b.Keys(ctx); err != nil || len(ks) != 0 {
		t.Fatalf("empty bucket: %v, %v; want no keys, no error", ks, err)
	}
	for _, k := range []string{"a.1", "a.2", "a.3", "b.1"} {
		if _, err := kv.PutString(ctx, k, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "a.1"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "a.2"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "a.3"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "a.3", "again"); err != nil {
		t.Fatal(err)
	}
	vals, err := b.Values(ctx, "a.>")
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 1 || vals["a.3"] == nil || string(vals["a.3"].Value()) != "again" {
		t.Fatalf("Values(a.>) = %v, want only a.3 = again", vals)
	}
	ks, err := b.Keys(ctx, "a.>", "b.>")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ks) != "[a.3 b.1]" {
		t.Fatalf("Keys(a.>, b.>) = %v, want [a.3 b.1]", ks)
	}
}

// Reads of one Bucket at once (an agent's slots claiming asks beside each
// other) share its stream's handle, which keeps each Info's answer: under
// -race, reads that are not serialized where they touch it fail here. Each
// read still holds every key.
func TestReadsAtOnceShareTheStream(t *testing.T) {
	b, _, keys := bucket(t, 20)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				got, err := b.Keys(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) != len(keys) {
					t.Errorf("read %d keys, want %d", len(got), len(keys))
					return
				}
			}
		})
	}
	wg.Wait()
}
