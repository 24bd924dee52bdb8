package agent

import (
	"context"
	"sync"
)

// running is the builds an agent is working on, by ask id, for Cancel. A
// build is cancellable from start until its stop: stop and cancel exclude
// each other, so the cause stop returns is final — a cancel that won is
// seen, one that came after is refused (and answered "not mine").
type running struct {
	mu     sync.Mutex
	builds map[string]*build
}

type build struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// start registers the build of ask id and returns its context, and stop,
// which deregisters it and returns why its context was cancelled (nil if
// it was not).
func (r *running) start(ctx context.Context, id string) (context.Context, func() error) {
	bctx, cancel := context.WithCancelCause(ctx)
	b := &build{ctx: bctx, cancel: cancel}
	r.mu.Lock()
	if r.builds == nil {
		r.builds = map[string]*build{}
	}
	r.builds[id] = b
	r.mu.Unlock()
	return bctx, func() error {
		r.mu.Lock()
		if r.builds[id] == b {
			delete(r.builds, id)
		}
		cause := context.Cause(bctx)
		r.mu.Unlock()
		cancel(nil)
		return cause
	}
}

// cancel cancels the build of ask id with ErrCancelled, if it is running.
func (r *running) cancel(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.builds[id]
	if ok {
		b.cancel(ErrCancelled)
	}
	return ok
}

// stopWith cancels the build of ask id with cause, if it is running.
func (r *running) stopWith(id string, cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b, ok := r.builds[id]; ok {
		b.cancel(cause)
	}
}

// has reports whether ask id is being worked on.
func (r *running) has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.builds[id]
	return ok
}
