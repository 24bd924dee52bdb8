package cascade

import (
	"fmt"
	"slices"
	"time"
)

// Cancel cancels the plan: every waiting or ready module is cancelled at
// once (failed and blocked ones keep their cause); every queued or building
// module becomes cancelling, and its ask id is returned (sorted) for the
// caller to withdraw from the queue and cut short on its holder. A
// cancelling module becomes cancelled when its holder reports (failed
// {cancelled}, or a built that came too late, see Built), when the caller
// withdrew its ask before any holder had it ([State.Withdrawn]), or when a
// bound passes ([State.ExpireCancelling]); until then the plan is running.
// Cancelling a settled or cancelled plan does nothing.
func (s *State) Cancel(now time.Time) (cancelAsks []string) {
	s.ensure()
	if !s.Cancelled.IsZero() || s.Settled() {
		return nil
	}
	s.Cancelled = now
	s.touch(now)
	for i := range s.Modules {
		m := &s.Modules[i]
		switch m.State {
		case Queued, Building:
			cancelAsks = append(cancelAsks, inFlightAsks(*m)...)
			s.set(m, Cancelling)
		case Waiting, Ready:
			s.set(m, Cancelled)
			m.Finished = now
		}
	}
	slices.Sort(cancelAsks)
	return cancelAsks
}

// Cancelling returns the ask ids of the cancelling modules, sorted: after
// a reload the caller asks their holders again to stop.
func (s *State) Cancelling() []string {
	var out []string
	for _, m := range s.Modules {
		if m.State == Cancelling {
			out = append(out, inFlightAsks(m)...)
		}
	}
	slices.Sort(out)
	return out
}

// Withdrawn records that a cancelling module's ask was taken out of the
// queue before any holder received it: nothing works on it, so it is
// cancelled. It reports whether the state changed (not for another ask, or
// one a holder announced started).
func (s *State) Withdrawn(ask string, now time.Time) bool {
	s.ensure()
	for i := range s.Modules {
		m := &s.Modules[i]
		for k := range m.Platforms {
			if p := &m.Platforms[k]; p.Ask == ask && m.State == Cancelling && p.State == Queued {
				p.State = Cancelled
				s.platformStopped(m, "", "", "withdrawn from the queue before any holder took it", now)
				return true
			}
		}
		if m.Ask == ask && m.State == Cancelling && m.Started.IsZero() {
			s.stopped(m, "", "", "withdrawn from the queue before any holder took it", now)
			return true
		}
	}
	return false
}

// ExpireCancelling cancels the modules still cancelling bound after the
// plan was cancelled (their holder died, or never heard): it returns them.
func (s *State) ExpireCancelling(now time.Time, bound time.Duration) []string {
	since := s.Cancelled
	if since.IsZero() || (!s.Superseding.IsZero() && s.Superseding.Before(since)) {
		since = s.Superseding
	}
	if since.IsZero() || now.Sub(since) < bound {
		return nil
	}
	var out []string
	for i := range s.Modules {
		m := &s.Modules[i]
		if m.State == Cancelling {
			s.stopped(m, "", "", fmt.Sprintf("no word from its holder %s after the cancel", bound), now)
			out = append(out, m.Module)
		}
	}
	return out
}
