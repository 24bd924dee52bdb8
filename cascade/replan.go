package cascade

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

// Replan is what it takes to plan a running plan again: its trigger and
// its schedule (priority, owner, cap).
type Replan struct {
	Trigger  planner.Trigger
	Schedule mesh.Schedule
}

// Running is a Replan for each plan still running on this controller,
// oldest first: for a controller that stopped because the bus lost its
// store (a server started again on an empty one), and every plan with it.
// The daemon hands them to the controller it starts on the wire raised
// again (Replan). Call it once Run has returned.
func (c *Controller) Running() []Replan {
	var sts []*State
	for _, st := range c.plans {
		if st.Outcome() == OutcomeRunning {
			sts = append(sts, st)
		}
	}
	slices.SortFunc(sts, func(a, b *State) int { return cmp.Compare(a.Seq, b.Seq) })
	out := make([]Replan, 0, len(sts))
	for _, st := range sts {
		p := st.Priority
		out = append(out, Replan{Trigger: st.Trigger, Schedule: mesh.Schedule{Priority: &p, Owner: st.Owner, Cap: st.Cap}})
	}
	return out
}

// Replan has Run plan rs again once it has resumed the store's plans; a
// plan the store still has is left as it is. Call it before Run.
func (c *Controller) Replan(rs []Replan) { c.replans = append(c.replans, rs...) }

// replan plans again what Replan was given: each plan under its own id
// (its trigger's), built anew where the bus lost what it had built.
func (c *Controller) replan(ctx context.Context) {
	now := time.Now().UTC()
	for _, r := range c.replans {
		sched := r.Schedule
		rec, created, err := c.createPlan(ctx, r.Trigger, &sched, now, 0)
		switch {
		case err != nil:
			c.log.Error("planning again a plan the bus lost: push it again", "trigger", r.Trigger.String(), "err", err)
		case created:
			c.log.Warn("planned again: the bus lost this plan with its store", "plan", rec.ID, "trigger", r.Trigger.String())
		}
	}
	c.replans = nil
}
