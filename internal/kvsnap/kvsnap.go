// Package kvsnap reads every key of a JetStream key-value bucket, and
// watches a bucket with a marker that comes only once every key has been
// delivered.
//
// A KeyWatcher of nats.go sends its nil "initial values done" marker once
// it has received as many entries as its consumer had pending when it was
// made, or once an entry says nothing is pending behind it. In a bucket
// written while it is read neither holds: a key delivered and written
// again is counted twice, and a key whose message the consumer had not yet
// reached when it was written again comes after the marker (the pending
// count the server keeps is a running figure, and was seen at 0 with keys
// still to come). A listing that stops at that marker leaves out a key
// that exists — a running plan missing from `builds plans`, a claim
// missing from a seat's holders.
//
// At the marker, this package asks the server for every subject the
// bucket's stream holds under the watch's filters — one snapshot, taken
// under the stream's lock — and gets each key of it the watch has not
// delivered yet, before its own marker. A key that existed all through a
// read is in it.
package kvsnap

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket reads one key-value bucket. Its stream is looked up at its first
// read and kept.
type Bucket struct {
	js jetstream.JetStream
	kv jetstream.KeyValue

	mu     sync.Mutex
	stream jetstream.Stream
	// infoMu serializes the stream's Info: it keeps the answer in the
	// handle, which concurrent watches share.
	infoMu sync.Mutex
}

// New is a Bucket reading kv through js.
func New(js jetstream.JetStream, kv jetstream.KeyValue) *Bucket {
	return &Bucket{js: js, kv: kv}
}

// ErrWatchEnded is returned when the bucket's watch ends before it has
// delivered every key (its subscription closed: the connection is gone).
var ErrWatchEnded = errors.New("the watch ended before every key was read")

// Values returns the current entry of every key that matches one of
// filters (">" when none) and has a value, by key; deleted and purged keys
// are left out.
func (b *Bucket) Values(ctx context.Context, filters ...string) (map[string]jetstream.KeyValueEntry, error) {
	return b.read(ctx, filters)
}

// Keys returns every key that matches one of filters (">" when none) and
// has a value, sorted; none is an empty list, not an error.
func (b *Bucket) Keys(ctx context.Context, filters ...string) ([]string, error) {
	m, err := b.read(ctx, filters, jetstream.MetaOnly())
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

func (b *Bucket) read(ctx context.Context, filters []string, opts ...jetstream.WatchOpt) (map[string]jetstream.KeyValueEntry, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := b.Watch(ctx, filters, opts...)
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string]jetstream.KeyValueEntry{}
	for e := range w.Updates() {
		if e == nil {
			return out, nil
		}
		if e.Operation() == jetstream.KeyValuePut {
			out[e.Key()] = e
		} else {
			delete(out, e.Key())
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, w.Err()
}

// Watcher is a watch of a bucket: every key's current entry, then a nil
// marker, then each change; deletions and purges included. A key's entries
// come in the order of their revisions, each once.
type Watcher struct {
	out  chan jetstream.KeyValueEntry
	stop context.CancelFunc
	done chan struct{}
	err  error
}

// Updates is the watch's entries. It is closed when the watch ends: Stop
// was called, its context ended, or the connection is gone (Err says).
func (w *Watcher) Updates() <-chan jetstream.KeyValueEntry { return w.out }

// Stop ends the watch.
func (w *Watcher) Stop() { w.stop(); <-w.done }

// Err says why the watch ended by itself, once Updates is closed: nil
// after Stop or the end of its context.
func (w *Watcher) Err() error { <-w.done; return w.err }

// Watch watches every key matching one of filters (">" when none). opts
// are the KeyWatcher's; jetstream.IgnoreDeletes is not one (a caller that
// has no use for deletions skips them).
func (b *Bucket) Watch(ctx context.Context, filters []string, opts ...jetstream.WatchOpt) (*Watcher, error) {
	if len(filters) == 0 {
		filters = []string{">"}
	}
	ctx, stop := context.WithCancel(ctx)
	// WatchFiltered writes the subject of each filter over it: it gets a copy.
	kw, err := b.kv.WatchFiltered(ctx, slices.Clone(filters), opts...)
	if err != nil {
		stop()
		return nil, fmt.Errorf("watching %s %v: %w", b.kv.Bucket(), filters, err)
	}
	w := &Watcher{out: make(chan jetstream.KeyValueEntry), stop: stop, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.out)
		defer func() { _ = kw.Stop() }()
		w.err = b.run(ctx, kw, filters, w.out)
		if ctx.Err() != nil {
			w.err = nil
		}
	}()
	return w, nil
}

func (b *Bucket) run(ctx context.Context, kw jetstream.KeyWatcher, filters []string, out chan<- jetstream.KeyValueEntry) error {
	seen := map[string]uint64{} // revision of each key's last entry sent
	current := false
	send := func(e jetstream.KeyValueEntry) bool {
		select {
		case out <- e:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case e, ok = <-kw.Updates():
		}
		if !ok {
			return fmt.Errorf("watching %s %v: %w", b.kv.Bucket(), filters, ErrWatchEnded)
		}
		if e == nil {
			if current {
				continue
			}
			rest, err := b.unseen(ctx, filters, seen)
			if err != nil {
				return err
			}
			for _, r := range rest {
				seen[r.Key()] = r.Revision()
				if !send(r) {
					return nil
				}
			}
			current = true
			if !send(nil) {
				return nil
			}
			continue
		}
		if rev, ok := seen[e.Key()]; ok && e.Revision() <= rev {
			continue // already sent, got at the marker
		}
		seen[e.Key()] = e.Revision()
		if !send(e) {
			return nil
		}
	}
}

// Listed returns every key the bucket's stream holds a message of under
// one of filters (">" when none), sorted: the stream leader's answer, one
// snapshot taken under the stream's lock, with no consumer made — so a key
// written before the call is in it. A key whose last entry is a deletion,
// a purge or the server's marker of a lapse is listed too: read each key
// to know whether it has a value. It asks what a watch asks at its marker
// (Watch), and is what to use where a listing must answer while a cluster
// regains quorum: a watch's consumer is made through the cluster's meta
// leader, and was seen taking longer than a claim's lease to be made then.
func (b *Bucket) Listed(ctx context.Context, filters ...string) ([]string, error) {
	if len(filters) == 0 {
		filters = []string{">"}
	}
	st, err := b.streamOf(ctx)
	if err != nil {
		return nil, err
	}
	prefix := mesh.KVKeySubject(b.kv.Bucket(), "")
	var keys []string
	for _, f := range filters {
		b.infoMu.Lock()
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(mesh.KVKeySubject(b.kv.Bucket(), f)))
		b.infoMu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("listing the keys of %s under %s: %w", b.kv.Bucket(), f, err)
		}
		for subj := range info.State.Subjects {
			if k, ok := strings.CutPrefix(subj, prefix); ok {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// unseen gets every key the stream holds under filters that is not in
// seen and has a value now, in key order.
func (b *Bucket) unseen(ctx context.Context, filters []string, seen map[string]uint64) ([]jetstream.KeyValueEntry, error) {
	keys, err := b.Listed(ctx, filters...)
	if err != nil {
		return nil, err
	}
	var out []jetstream.KeyValueEntry
	for _, k := range keys {
		if _, had := seen[k]; had {
			continue
		}
		e, err := b.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted since
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s %s: %w", b.kv.Bucket(), k, err)
		}
		out = append(out, e)
	}
	return out, nil
}

func (b *Bucket) streamOf(ctx context.Context) (jetstream.Stream, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stream != nil {
		return b.stream, nil
	}
	st, err := b.js.Stream(ctx, mesh.KVStream(b.kv.Bucket()))
	if err != nil {
		return nil, fmt.Errorf("looking up the stream of %s: %w", b.kv.Bucket(), err)
	}
	b.stream = st
	return st, nil
}
