package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/kvsnap"
)

// PlanChange is one change to a watched plan: its record, or one of its
// modules' status. Exactly one of Record and Module is set, or Err when
// a value could not be decoded (the watch goes on).
type PlanChange struct {
	Record *PlanRecord
	Module *ModuleStatus
	Err    error
}

// PlanWatcher follows one plan in the store: the current values of its
// record and its modules first, then every change, each decoded. It is a
// handle on a KV watch, in the shape of jetstream.KeyWatcher: read
// Changes, Stop it when done.
type PlanWatcher struct {
	w        *kvsnap.Watcher
	changes  chan PlanChange
	current  chan struct{}
	stopped  chan struct{}
	stopOnce sync.Once
}

// WatchPlan starts watching plan's record and modules. A plan that does
// not exist yet is watched all the same: its record arrives when the
// controller makes it. The watch ends when ctx is done or on Stop; then
// Changes is closed.
func (s *Store) WatchPlan(ctx context.Context, plan string) (*PlanWatcher, error) {
	w, err := s.snap.Watch(ctx, []string{PlanKey(plan), ModulesOf(plan)})
	if err != nil {
		return nil, fmt.Errorf("watching plan %s: %w", plan, err)
	}
	pw := &PlanWatcher{w: w, changes: make(chan PlanChange), current: make(chan struct{}), stopped: make(chan struct{})}
	go pw.run(ctx, plan, s.kv.Bucket())
	return pw, nil
}

// run decodes the KV watch's entries into Changes. Once the watch is over
// (ctx done, or Stop) it drains the entries until the KV watch closes
// them: a KV watcher blocked on a full channel would not stop.
func (pw *PlanWatcher) run(ctx context.Context, plan, bucket string) {
	defer close(pw.changes)
	defer context.AfterFunc(ctx, func() { _ = pw.Stop() })()
	prefix := ModuleKey(plan, "")
	over, current := false, false
	for e := range pw.w.Updates() {
		if over {
			continue
		}
		var c PlanChange
		switch {
		case e == nil:
			if !current {
				current = true
				close(pw.current)
			}
			continue
		case e.Operation() != jetstream.KeyValuePut:
			continue // a pruned plan's keys
		case e.Key() == PlanKey(plan):
			var r PlanRecord
			if err := json.Unmarshal(e.Value(), &r); err != nil {
				c.Err = &UnreadableError{Bucket: bucket, Keys: []string{e.Key()}, Err: fmt.Errorf("decoding plan %s: %w", plan, err)}
			} else {
				c.Record = &r
			}
		case strings.HasPrefix(e.Key(), prefix):
			var m ModuleStatus
			if err := json.Unmarshal(e.Value(), &m); err != nil {
				c.Err = &UnreadableError{Bucket: bucket, Keys: []string{e.Key()}, Err: fmt.Errorf("decoding %s: %w", e.Key(), err)}
			} else {
				if m.Module == "" {
					m.Module = strings.TrimPrefix(e.Key(), prefix)
				}
				c.Module = &m
			}
		default:
			continue
		}
		select {
		case pw.changes <- c:
		case <-pw.stopped:
			over = true
		}
	}
}

// Changes delivers the plan's changes; it is closed when the watch ends.
func (pw *PlanWatcher) Changes() <-chan PlanChange { return pw.changes }

// Current is closed once the values the plan had when the watch started
// have all been delivered (none if the plan does not exist yet).
func (pw *PlanWatcher) Current() <-chan struct{} { return pw.current }

// Stop ends the watch; Changes is closed soon after. It is safe to call
// more than once.
func (pw *PlanWatcher) Stop() error {
	pw.stopOnce.Do(func() {
		close(pw.stopped)
		pw.w.Stop()
	})
	return nil
}
