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

// inHand is the asks an agent has in hand, by id: from the delivery's
// claim until its outcome is settled — announced and acknowledged, or
// handed back. That is longer than its build (running), which ends before
// the outcome is announced and, Config.Overlap, before the slot pulls its
// next ask: an ask delivered again meanwhile (its ack wait ran out in an
// outage) reached the slot while the first delivery was settling, claimed
// the machine's one key over it, the first's built was refused, and the
// ask was built and announced twice (cascade
// TestClusterWithoutQuorumRefusesAndResumes).
type inHand struct {
	mu  sync.Mutex
	ids map[string]bool
}

// take puts ask id in hand, and reports false when it is in hand already.
func (h *inHand) take(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ids[id] {
		return false
	}
	if h.ids == nil {
		h.ids = map[string]bool{}
	}
	h.ids[id] = true
	return true
}

// drop takes ask id out of hand.
func (h *inHand) drop(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.ids, id)
}
