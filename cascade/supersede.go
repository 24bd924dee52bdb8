package cascade

import (
	"context"
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
