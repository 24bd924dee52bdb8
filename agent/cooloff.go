package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A machine that gives an ask back to be retried after a delay, for a
// failure its probe does not explain (a fetch its own network cannot make,
// a registry error on its own route), does not pull again until that retry
// is due when another machine waits idle for work: the server hands a
// message to the pull that has waited longest, and an idle machine renews
// its pull every --fetch-wait while the failing one pulls again at once,
// so past that wait the failing machine was given the retry every time
// (by hand: a machine that could not resolve the repository's host took
// all four attempts of an ask while another sat idle). Without another
// machine waiting it pulls at once: its other asks are not held up.

// The cool-off grows with the machine's run of such failures, whatever
// the ask: a machine that fails every ask it takes for a cause of its own
// that its probe does not see (its BuildKit's disk full: by hand, 44 asks
// taken and given back in one 39-module plan, each a fresh ask's first
// 2 s delay, while another machine built them all) waits the retry delay of
// its run — 2s, 4s … up to maxRunCoolOff — before it takes the next, so
// it takes a few asks, not every one, until it builds again (a built ends
// the run). The bound keeps a fleet whose machines all failed for a while
// (a git server down) from waiting long once the cause is gone.

// maxRunCoolOff bounds the cool-off a run of failures gives a machine.
const maxRunCoolOff = 16 * time.Second

// coolOffMargin is how long after a retry is due the machine that gave it
// back pulls again: the server hands it to another in that time.
const coolOffMargin = 500 * time.Millisecond

// coolOff sets the slots' pulls to wait until the retry of the ask msg
// delivered, due after delay, has been handed to another machine, when
// another waits idle on the ask's consumer.
func (a *Agent) coolOff(ctx context.Context, msg jetstream.Msg, delay time.Duration, log *slog.Logger) {
	run := a.failRun.Add(1)
	if delay <= 0 {
		return
	}
	if !a.othersIdle(ctx, msg) {
		return
	}
	delay = max(delay, min(a.cfg.retryDelay(int(run)), maxRunCoolOff))
	until := time.Since(a.started) + delay + coolOffMargin
	for {
		cur := a.coolUntil.Load()
		if int64(until) <= cur || a.coolUntil.CompareAndSwap(cur, int64(until)) {
			break
		}
	}
	log.Info("leaving the retry to a machine that waits idle: no pull until it is due", "for", delay+coolOffMargin)
}

// othersIdle reports whether a pull of another machine waits on the
// consumer msg was delivered from. A yes is kept for a --fetch-wait: a
// consumer's info walks every waiting pull on the server
// (consumer.processWaiting), which a fleet failing at once, its machines
// idle, must not ask for at every retry. A no is kept for a second only
// (few pulls wait then, and the walk is short): by hand, a no kept for the
// whole wait sent the next two retries back to the failing machine.
func (a *Agent) othersIdle(ctx context.Context, msg jetstream.Msg) bool {
	a.idleMu.Lock()
	defer a.idleMu.Unlock()
	keep := min(time.Second, a.cfg.FetchWait)
	if a.idle {
		keep = a.cfg.FetchWait
	}
	if !a.idleAt.IsZero() && time.Since(a.idleAt) < keep {
		return a.idle
	}
	md, err := msg.Metadata()
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := a.js.Consumer(ctx, md.Stream, md.Consumer)
	if err != nil {
		return false // not known: pull as before
	}
	// This machine's own idle slots wait too; the slot that gave the ask
	// back has not pulled again yet.
	own := max(int64(a.cfg.Slots)-a.inFlight.Load()-1, 0)
	a.idle, a.idleAt = int64(c.CachedInfo().NumWaiting)-own > 0, time.Now()
	return a.idle
}

// awaitCooled waits, on a slot about to pull, until the machine's cool-off
// (coolOff) is over; false if ctx ended first.
func (a *Agent) awaitCooled(ctx context.Context) bool {
	d := time.Duration(a.coolUntil.Load()) - time.Since(a.started)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
