package cascade

import (
	"context"
	"slices"
	"time"

	"github.com/meshbuild/meshbuild/planner"
)

// supersede applies a new plan to the other running plans pushed to the
// same repository and ref: the older of each pair is superseded by the
// newer (State.Supersede) in what the newer builds and the older has not
// started, so a second push to a branch does not build the first's
// modules twice. Usually the new plan is the newer; a push delivered again
// after a newer one was planned is the older, and is superseded at once.
// With cancel, the older plan's builds in flight that the newer plan
// builds are withdrawn and cut short too.
func (c *Controller) supersede(ctx context.Context, st *State, cancel bool, now time.Time) {
	if st.Trigger.Kind != planner.KindPush {
		return
	}
	repo, ref := planner.NormaliseRepo(st.Trigger.Repo), st.Trigger.Ref
	for _, o := range c.plans {
		if o == st || o.Trigger.Kind != planner.KindPush || o.Trigger.Ref != ref ||
			planner.NormaliseRepo(o.Trigger.Repo) != repo || o.Outcome() != OutcomeRunning {
			continue
		}
		older, newer := o, st
		if Newer(Current{Seq: o.Seq, Created: o.Created}, Current{Seq: st.Seq, Created: st.Created}) {
			older, newer = st, o
		}
		mods, asks := older.Supersede(newer.Plan, func(m string) bool { _, ok := newer.Module(m); return ok }, cancel, now)
		if len(mods) == 0 && len(asks) == 0 {
			continue
		}
		c.log.Info("plan superseded by a newer one for the same ref", "plan", older.Plan, "by", newer.Plan,
			"ref", ref, "superseded", len(mods), "cancelled", len(asks))
		c.touch(older, mods...)
		if len(asks) > 0 {
			c.withdraw(ctx, older, asks, now)
			for _, m := range older.Modules {
				if m.SupersededBy == newer.Plan {
					c.touch(older, m.Module)
				}
			}
			c.cancelOnHolders(asks)
		}
	}
}

// Supersede settles, for the newer plan of the same repository and ref,
// every module of this plan that builds reports the newer plan builds too
// and that has not started (waiting, or ready: held for a machine) as
// superseded, SupersededBy newer, and with it every module waiting on a
// superseded one, transitively. A module in flight (queued or building)
// finishes; with cancel it becomes cancelling instead, its asks returned
// (sorted) for the caller to withdraw and cut short, and settles
// superseded when its holder stops (see Cancel; a built that arrives is
// not the plan's). It returns the modules superseded now, in plan order.
// A cancelled or settled plan, or a module already finished, is left
// alone.
func (s *State) Supersede(newer string, builds func(module string) bool, cancel bool, now time.Time) (superseded, cancelAsks []string) {
	s.ensure()
	if !s.Cancelled.IsZero() || newer == "" || newer == s.Plan {
		return nil, nil
	}
	mark := func(i int) {
		m := &s.Modules[i]
		s.set(m, Superseded)
		m.SupersededBy, m.Finished = newer, now
		superseded = append(superseded, m.Module)
	}
	for i := range s.Modules {
		m := &s.Modules[i]
		if !builds(m.Module) {
			continue
		}
		switch m.State {
		case Waiting, Ready:
			mark(i)
		case Queued, Building:
			if cancel {
				cancelAsks = append(cancelAsks, inFlightAsks(*m)...)
				s.set(m, Cancelling)
				m.SupersededBy = newer
				s.Superseding = now
			}
		}
	}
	for i := range s.Modules {
		if s.Modules[i].SupersededBy == newer {
			superseded = append(superseded, s.supersedeDown(i, newer, now)...)
		}
	}
	if len(superseded) > 0 || len(cancelAsks) > 0 {
		s.touch(now)
	}
	slices.SortFunc(superseded, func(a, b string) int { return s.ix.pos[a] - s.ix.pos[b] })
	slices.Sort(cancelAsks)
	return superseded, cancelAsks
}

// supersedeDown settles superseded every module waiting, transitively, on
// module i (superseded, or to be): its base will not be built in this
// plan. It returns them.
func (s *State) supersedeDown(i int, newer string, now time.Time) (out []string) {
	queue := []int{i}
	for k := 0; k < len(queue); k++ {
		for _, d := range s.ix.deps[queue[k]] {
			dm := &s.Modules[d]
			if dm.State != Waiting {
				continue
			}
			s.set(dm, Superseded)
			dm.SupersededBy, dm.Finished = newer, now
			out = append(out, dm.Module)
			queue = append(queue, d)
		}
	}
	return out
}
