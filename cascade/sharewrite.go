package cascade

import (
	"context"
	"errors"
	"time"
)

// # The modules still waiting are stored beside the loop
//
// A big plan's modules still waiting are stored a share at a time
// (someWaiting), for the people and tools that read the store: a restart
// needs none of them (a module not stored is loaded as waiting). A share
// stored by the loop itself held every turn of a busy plan's first
// seconds: on three servers (R3, sync always), 1,000 machines, a share of
// 256 took 35-120 ms of a turn of 300-600 ms, in nearly every turn for
// the first 6 s of a 10,000-module plan — the seconds its first tiers
// finish, when the critical path's outcomes waited 150-790 ms each to be
// worked. So a share is handed to a goroutine (storeShare) and the loop
// goes on: its events, its asks, its other writes.
//
// One share is in flight at a time, and the next is taken spareEvery after
// the last was stored — at once if the loop worked no event meanwhile. A key of the share in flight is written by the loop
// only once the share is stored (persist waits for it: awaitShareOf), so
// a module's newer state is never overwritten by its waiting one; its
// waiting write is not dropped, only made first. Pruning plans, and Run's
// end, wait for the share as well. A share the store refused is owed again
// (shareStored), each module of it that still waits and has no newer state
// to store.

// shareWrite is a share of the modules still waiting, being stored beside
// the loop: its keys and values, and the store's answer once it is in.
type shareWrite struct {
	keys map[string]any
	done chan error
}

// storeShare stores share beside the loop (nothing when empty).
func (c *Controller) storeShare(ctx context.Context, share map[string]any) {
	if len(share) == 0 {
		return
	}
	w := &shareWrite{keys: share, done: make(chan error, 1)}
	c.sharing = w
	c.busySinceShare = false
	write := c.writeShare
	if write == nil {
		write = c.store.Put
	}
	go func() { w.done <- write(ctx, share) }()
}

// shareDone is the answer of the share in flight; nil (never ready) when
// none is.
func (c *Controller) shareDone() <-chan error {
	if c.sharing == nil {
		return nil
	}
	return c.sharing.done
}

// shareStored takes the store's answer to the share in flight: the next
// share is due spareEvery from now; a module whose write was refused is
// owed again if it still waits and no newer state of it is to be stored.
func (c *Controller) shareStored(err error) {
	w := c.sharing
	c.sharing = nil
	c.spared = time.Now()
	if err == nil || w == nil {
		return
	}
	refused := w.keys
	if pe := (*PutError)(nil); errors.As(err, &pe) {
		refused = map[string]any{}
		for k := range pe.Failed {
			refused[k] = w.keys[k]
		}
	}
	again := 0
	for k, v := range refused {
		if _, newer := c.dirty[k]; newer {
			continue
		}
		ms, ok := v.(ModuleStatus)
		p, _ := PlanOfKey(k)
		st := c.plans[p]
		if !ok || st == nil {
			continue
		}
		if now, ok := st.Module(ms.Module); !ok || now.State != Waiting {
			continue
		}
		if c.owed == nil {
			c.owed = map[string]any{}
		}
		c.owed[k] = v
		again++
	}
	c.log.Warn("storing modules still waiting failed; they are stored with a later share", "modules", again, "err", err)
}

// awaitShareOf waits for the share in flight when phase writes a key of
// it: the newer state is stored after the waiting one.
func (c *Controller) awaitShareOf(phase map[string]any) {
	if c.sharing == nil {
		return
	}
	for k := range phase {
		if _, in := c.sharing.keys[k]; in {
			c.awaitShare()
			return
		}
	}
}

// awaitShare waits for the share in flight, if any, and takes its answer.
func (c *Controller) awaitShare() {
	if c.sharing != nil {
		c.shareStored(<-c.sharing.done)
	}
}
