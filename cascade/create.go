package cascade

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

// createPlan plans a trigger and starts it; a plan that exists already is
// not made again (created false).
//
// The bases outside the plan are resolved here, once, before anything is
// stored: the plan's asks are all pinned to them. A base that has no image
// (never built, and no latest tag in the registry) refuses the plan with an
// error wrapping ErrNoBase that names the base and the command that builds
// it: the requester of a rebuild gets it as the tool's answer, and a push is
// logged and leaves no plan, so announcing the same push again once the
// base is built makes the plan. (Marking only the modules built on it
// blocked would leave a plan that no retry can mend: the base is outside
// it.)
//
// A plan's sequence number (State.Seq, what makes a plan newer) is at, the
// trigger's place on the bus (a push's EVENTS sequence), when it has one;
// else (a tool's request, at 0) the next after every plan made so far.
func (c *Controller) createPlan(ctx context.Context, t planner.Trigger, sched *mesh.Schedule, now time.Time, at uint64) (PlanRecord, bool, error) {
	p, err := c.ix.Plan(t)
	if err != nil {
		return PlanRecord{}, false, err
	}
	if st, ok := c.plans[p.ID]; ok {
		return Record(st), false, nil
	}
	if old, err := c.store.Plan(ctx, p.ID); err == nil {
		return old, false, nil
	} else if !errors.Is(err, ErrNoPlan) {
		return PlanRecord{}, false, err
	}
	st := NewState(p, now)
	if err := c.pin(ctx, st, p); err != nil {
		return PlanRecord{}, false, fmt.Errorf("planning %s: %w", p.ID, err)
	}
	c.address(ctx, st)
	c.previous(ctx, st)
	st.SetKnown(c.known)
	st.Seq = c.seq + 1
	if at > 0 {
		st.Seq = at
	}
	st.Window = c.planWindow()
	if len(c.lastBuild) > 0 {
		st.SetEstimates(c.lastBuild)
	}
	if err := c.planSchedule(st, sched); err != nil {
		return PlanRecord{}, false, fmt.Errorf("planning %s: %w", p.ID, err)
	}
	rec := Record(st)
	if p.Empty() {
		rec.Outcome, rec.Finished = OutcomeEmpty, now
		rec.Message = "nothing to build: " + emptyReason(t)
	}
	created, err := c.store.CreatePlan(ctx, rec)
	if err != nil {
		return rec, false, err
	}
	if !created {
		old, err := c.store.Plan(ctx, p.ID)
		return old, false, err
	}
	c.seq = max(c.seq, st.Seq)
	c.log.Info("plan", "plan", p.ID, "trigger", st.Summary, "modules", len(p.Modules), "tiers", len(p.Tiers))
	if p.Empty() {
		return rec, true, nil
	}
	c.plans[p.ID] = st
	c.supersede(ctx, st, c.cfg.CancelSuperseded || (sched != nil && sched.CancelSuperseded), now)
	c.rewindow()
	c.enqueue(st, st.Start(now))
	for _, m := range st.Modules {
		c.touch(st, m.Module)
	}
	return rec, true, nil
}

// pin resolves the plan's bases outside it and pins the state to them.
func (c *Controller) pin(ctx context.Context, st *State, p planner.Plan) error {
	digests := make(map[string]string, len(p.External))
	var errs []error
	for _, e := range p.External {
		d, err := c.currentDigest(ctx, e.Module)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w (needed by %s)", err, strings.Join(e.NeededBy, ", ")))
			continue
		}
		digests[e.Module] = d
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return st.Pin(digests)
}

func emptyReason(t planner.Trigger) string {
	if t.Kind == planner.KindPush {
		if len(t.Paths) > 0 {
			return fmt.Sprintf("no module is built from %s under the changed paths", t.Repo)
		}
		return fmt.Sprintf("no module in the catalogue is built from %s", t.Repo)
	}
	return "no module selected"
}
