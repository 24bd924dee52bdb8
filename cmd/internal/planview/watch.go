// Package planview is how an operator sees a plan: followed live until it
// settles (Watch, on the store's plan watch handle) and printed tier by
// tier (PrintPlan). `builds watch`, `builds show` and the demo of
// `builds up` all go through it.
package planview

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
)

// Plan is a plan as a watch has seen it so far.
type Plan struct {
	Record cascade.PlanRecord
	// Made is set once the plan's record has arrived.
	Made    bool
	Modules map[string]cascade.ModuleStatus
}

// Settled reports whether the plan has nothing left in flight and every one
// of its modules has arrived finished: the module keys of a settled plan
// may arrive after its record.
func (p Plan) Settled() bool {
	c := p.Record.Counts
	if !p.Made || p.Record.Outcome == cascade.OutcomeRunning || c.Waiting+c.Ready+c.Queued+c.Building > 0 {
		return false
	}
	if len(p.Modules) < c.Total {
		return false
	}
	for _, m := range p.Modules {
		if !m.State.Finished() {
			return false
		}
	}
	return true
}

// DefaultAppear is how long Watch waits for a plan that is not made yet:
// a push reaches the controller a moment after it is published.
const DefaultAppear = 10 * time.Second

// Options are what a watcher does while it follows a plan.
type Options struct {
	// Appear bounds the wait for the plan's record; 0 is DefaultAppear.
	Appear time.Duration
	// Changed, if set, is called after every change with the plan as it
	// stands: module is the module that changed and was its state before
	// (empty for a module not seen before), or module is nil when the
	// plan's record changed.
	Changed func(p Plan, module *cascade.ModuleStatus, was cascade.ModuleState)
	// Ticked, if set, is called every Tick (default 200ms) with the plan as
	// it stands, e.g. to redraw an elapsed time.
	Ticked func(p Plan)
	Tick   time.Duration
	// Fetching, if set, is called once if the plan is not made within
	// Appear because the controller fetches its push's commit first.
	Fetching func(f cascade.Fetching)
}

// fetchingStale is how old a record of a push's fetch may be and still be
// waited for: the controller's bound on the fetch, and a minute (a record
// older is a controller's that stopped mid-fetch).
const fetchingStale = cascade.PrefetchTimeout + time.Minute

// Watch follows a plan in st until it settles and returns it settled. A plan
// not made within Options.Appear is an error wrapping cascade.ErrNoPlan.
// When ctx ends, Watch returns the plan as it stands and context.Cause(ctx).
func Watch(ctx context.Context, st *cascade.Store, plan string, o Options) (Plan, error) {
	if o.Appear <= 0 {
		o.Appear = DefaultAppear
	}
	if o.Tick <= 0 {
		o.Tick = 200 * time.Millisecond
	}
	w, err := st.WatchPlan(ctx, plan)
	if err != nil {
		return Plan{}, err
	}
	defer w.Stop()
	p := Plan{Modules: map[string]cascade.ModuleStatus{}}
	appear := time.NewTimer(o.Appear)
	defer appear.Stop()
	fetching := false
	var tick <-chan time.Time
	if o.Ticked != nil {
		t := time.NewTicker(o.Tick)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return p, context.Cause(ctx)
		case <-appear.C:
			if !p.Made {
				// A push whose commit the controller fetches first is
				// planned when the fetch is done: waited for, said once.
				if f, ok, err := st.FetchingFor(ctx, plan); err == nil && ok && time.Since(f.Since) < fetchingStale {
					if o.Fetching != nil && !fetching {
						o.Fetching(f)
					}
					fetching = true
					appear.Reset(o.Appear)
					continue
				}
				return p, fmt.Errorf("%w %s: the controller made none within %s", cascade.ErrNoPlan, plan, o.Appear)
			}
		case <-tick:
			o.Ticked(p)
		case c, ok := <-w.Changes():
			if !ok {
				if err := context.Cause(ctx); err != nil {
					return p, err
				}
				return p, errors.New("watching plan " + plan + ": the watch stopped")
			}
			switch {
			case c.Err != nil:
				return p, c.Err
			case c.Record != nil:
				p.Record, p.Made = *c.Record, true
				if o.Changed != nil {
					o.Changed(p, nil, "")
				}
			case c.Module != nil:
				was := p.Modules[c.Module.Module].State
				p.Modules[c.Module.Module] = *c.Module
				if o.Changed != nil {
					o.Changed(p, c.Module, was)
				}
			}
			if p.Settled() {
				return p, nil
			}
		}
	}
}
