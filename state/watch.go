package state

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/kvsnap"
)

// Kind is what a watch event says.
type Kind string

// Kinds of watch event.
const (
	// Value is a key's value: current (before Current) or changed.
	Value Kind = "value"
	// Current marks the end of the current values: every change follows.
	Current Kind = "current"
	// Deleted is a key deleted: after Current, or before it for a key
	// whose value came before it.
	Deleted Kind = "deleted"
)

// Event is one event of a watch.
type Event struct {
	Kind     Kind   `json:"kind"`
	Key      string `json:"key,omitempty"`
	Value    []byte `json:"value,omitempty"`
	Revision uint64 `json:"revision,omitempty"`
}

// Watcher is a running watch: its events arrive on Events until Stop, which
// closes the channel.
type Watcher struct {
	events chan Event
	done   chan struct{}
	once   sync.Once
	stop   func()
	wg     sync.WaitGroup
}

// Events delivers the watch's events; it is closed when the watch stops.
func (w *Watcher) Events() <-chan Event { return w.events }

// Stop ends the watch and waits until Events is closed. Calling it again does
// nothing.
func (w *Watcher) Stop() {
	w.once.Do(func() {
		close(w.done)
		w.stop()
	})
	w.wg.Wait()
}

// newWatcher runs feed, which sends events with send until it returns or
// send reports false (the watch stopped); then Events is closed.
func newWatcher(ctx context.Context, stop func(), feed func(send func(Event) bool)) *Watcher {
	w := &Watcher{events: make(chan Event), done: make(chan struct{}), stop: stop}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(w.events)
		feed(func(e Event) bool {
			select {
			case w.events <- e:
				return true
			case <-w.done:
				return false
			case <-ctx.Done():
				return false
			}
		})
	}()
	go func() {
		select {
		case <-ctx.Done():
			w.once.Do(func() { close(w.done); w.stop() })
		case <-w.done:
		}
	}()
	return w
}

// watchKV turns a key-value watch into the state surface's order: current
// values, Current, then every change. Before Current a deletion is sent
// only for a key whose value was.
func watchKV(ctx context.Context, bucket string, kw *kvsnap.Watcher) *Watcher {
	return newWatcher(ctx, kw.Stop, func(send func(Event) bool) {
		current := false
		sent := map[string]bool{} // keys whose value was sent before Current
		for {
			var e jetstream.KeyValueEntry
			var ok bool
			select {
			case e, ok = <-kw.Updates():
			case <-ctx.Done():
				return
			}
			if !ok {
				return
			}
			var ev Event
			switch {
			case e == nil:
				current, sent = true, nil
				ev = Event{Kind: Current}
			case e.Operation() != jetstream.KeyValuePut:
				if !current && !sent[e.Key()] {
					continue
				}
				delete(sent, e.Key())
				ev = Event{Kind: Deleted, Key: e.Key(), Revision: e.Revision()}
			default:
				if !current {
					sent[e.Key()] = true
				}
				ev = Event{Kind: Value, Key: e.Key(), Value: e.Value(), Revision: e.Revision()}
			}
			if !send(ev) {
				return
			}
		}
	})
}
