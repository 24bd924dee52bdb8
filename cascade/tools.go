package cascade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/seat"
)

// The controller's tools (its manifest's serves), request/reply on
// mesh.mod.<controller>.tool.<name>.
const (
	ToolRebuild = "rebuild"
	ToolRetry   = "retry"
	ToolCancel  = "cancel"
	// ToolPriority changes a running plan's priority
	// (Request.Schedule.Priority).
	ToolPriority = "priority"
)

// Request is a tool request to the controller.
type Request struct {
	// ID names a rebuild's plan: the same id twice is one plan.
	ID      string   `json:"id,omitempty"`
	Modules []string `json:"modules,omitempty"`
	Plan    string   `json:"plan,omitempty"`
	Module  string   `json:"module,omitempty"`
	// Force makes a rebuild build every module, even those whose inputs
	// were built before (planner.Trigger.Force).
	Force bool `json:"force,omitempty"`
	// Schedule is what a rebuild asks of the scheduler, and the new
	// priority of a priority request.
	Schedule *mesh.Schedule `json:"schedule,omitempty"`
}

// Reply is the controller's answer.
type Reply struct {
	Plan    string     `json:"plan,omitempty"`
	Created bool       `json:"created,omitempty"`
	Record  PlanRecord `json:"record,omitzero"`
	Asks    []string   `json:"asks,omitempty"`
	Error   string     `json:"error,omitempty"`
	// Code classifies Error: one of toolCodes' codes.
	Code string `json:"code,omitempty"`
}

// Errors a tool answers with, matched with errors.Is on the client side.
var (
	ErrUnknownModule = planner.ErrUnknownModule
	ErrBadRequest    = errors.New("bad request")
	ErrNoController  = seat.ErrNoController
)

// toolCodes is the one table of the tools' error codes: a code crosses the
// wire in Reply.Code, and both sides match it with errors.Is. The
// controller answers an error with the first code whose first sentinel it
// wraps; the client's ToolError matches every sentinel of its code (so a
// module not built, or not in the plan, is also an unknown module to a
// caller that asks only that). An error no code matches is bad-request.
var toolCodes = seat.Codes{
	{Code: "unknown-module", Sentinels: []error{ErrUnknownModule}},
	{Code: "not-built", Sentinels: []error{planner.ErrNotBuilt, ErrUnknownModule}},
	{Code: "not-in-plan", Sentinels: []error{ErrNotInPlan, ErrUnknownModule}},
	{Code: "no-plan", Sentinels: []error{ErrNoPlan}},
	{Code: "not-failed", Sentinels: []error{ErrNotFailed}},
	{Code: "plan-cancelled", Sentinels: []error{ErrPlanCancelled}},
	{Code: "no-base", Sentinels: []error{ErrNoBase}},
	{Code: "bad-request", Sentinels: []error{ErrBadRequest}},
}

// codeOf is the code of an error the controller answers with.
func codeOf(err error) string {
	if code := toolCodes.Of(err); code != "" {
		return code
	}
	return "bad-request"
}

// ToolError is a tool's error answer as the client receives it: the
// controller's message, once, and its code, which errors.Is matches
// against the sentinels of toolCodes (errors.Is(err, ErrNoPlan)).
type ToolError = seat.Error

// Failure is the reply's error and its code (seat.Answer).
func (r Reply) Failure() (message, code string) { return r.Error, r.Code }

// command is a tool's request or a changed catalogue, handed to the
// controller's goroutine.
type command = seat.Command[Request]

func (c *Controller) serveTools() ([]*nats.Subscription, error) {
	var tools []seat.Tool
	for _, name := range []string{ToolRebuild, ToolRetry, ToolCancel, ToolPriority} {
		tools = append(tools, toolOf(c.module, name))
	}
	return seat.ServeInbox(c.nc, tools, c.cfg.ToolTimeout, c.cmds,
		func(err error) Reply { return Reply{Error: err.Error()} },
		func(err error) Reply {
			return Reply{Error: fmt.Sprintf("%v: malformed request: %v", ErrBadRequest, err), Code: codeOf(ErrBadRequest)}
		})
}

// toolOf is the controller module's tool by name.
func toolOf(controllerModule, name string) seat.Tool {
	return seat.Tool{Name: name, Subject: mesh.ModuleToolSubject(controllerModule, name)}
}

// command runs on the controller's goroutine.
func (c *Controller) command(ctx context.Context, cmd command) Reply {
	now := time.Now().UTC()
	fail := func(err error) Reply { return Reply{Error: err.Error(), Code: codeOf(err)} }
	switch cmd.Kind {
	case "catalogue":
		c.cat, c.catPlatforms, c.ix = cmd.Cat, cmd.Cat.Platforms(), planner.NewIndex(cmd.Cat)
		return Reply{}
	case ToolRebuild:
		if cmd.Req.ID == "" || len(cmd.Req.Modules) == 0 {
			return fail(fmt.Errorf("%w: a rebuild needs a request id and modules", ErrBadRequest))
		}
		rec, created, err := c.createPlan(ctx, rebuildTrigger(cmd.Req), cmd.Req.Schedule, now, 0)
		if err != nil {
			return fail(err)
		}
		return Reply{Plan: rec.ID, Created: created, Record: rec}
	case ToolRetry:
		st, err := c.plan(ctx, cmd.Req.Plan)
		if err != nil {
			return fail(err)
		}
		sub, err := st.Retry(cmd.Req.Module, now)
		if err != nil {
			return fail(err)
		}
		c.enqueue(st, []Submit{sub})
		for _, m := range st.Modules {
			c.touch(st, m.Module)
		}
		return Reply{Plan: st.Plan, Asks: []string{sub.AskID}, Record: Record(st)}
	case ToolCancel:
		st, err := c.plan(ctx, cmd.Req.Plan)
		if err != nil {
			return fail(err)
		}
		asks := st.Cancel(now)
		c.withdraw(ctx, st, asks, now)
		for _, m := range st.Modules {
			c.touch(st, m.Module)
		}
		c.cancelOnHolders(asks)
		return Reply{Plan: st.Plan, Asks: asks, Record: Record(st)}
	case ToolPriority:
		st, err := c.setPriority(ctx, cmd.Req)
		if err != nil {
			return fail(err)
		}
		return Reply{Plan: st.Plan, Record: Record(st)}
	}
	return fail(fmt.Errorf("%w: unknown command %q", ErrBadRequest, cmd.Kind))
}

// plan finds a plan the controller can still act on: running, or settled
// with failures (a retry may release it). A finished one is loaded from the
// store.
func (c *Controller) plan(ctx context.Context, id string) (*State, error) {
	if st, ok := c.plans[id]; ok {
		return st, nil
	}
	r, err := c.store.Plan(ctx, id)
	if err != nil {
		return nil, err
	}
	st, err := c.load(ctx, r)
	if err != nil {
		return nil, err
	}
	c.plans[id] = st
	return st, nil
}

// withdraw takes a cancelled plan's asks out of the work queue. An ask
// deleted before the seat's consumer ever delivered it reached no holder:
// its module is cancelled at once (State.Withdrawn). The others stay
// cancelling until their holder reports or Config.CancelWait passes.
func (c *Controller) withdraw(ctx context.Context, st *State, asks []string, now time.Time) {
	if len(asks) == 0 || c.lostSeat("withdrawing cancelled asks") {
		return
	}
	stream, err := c.js.Stream(ctx, mesh.SeatStream(mesh.BuildSeat))
	if err != nil {
		c.log.Warn("withdrawing cancelled asks", "err", err)
		return
	}
	deleted := map[string]uint64{}
	for _, a := range asks {
		if seq, ok := c.askSeq[a]; ok && stream.DeleteMsg(ctx, seq) == nil {
			deleted[a] = seq // a holder may have it still: see below
		}
	}
	if len(deleted) == 0 {
		return
	}
	// Read after the deletes: a message deleted beyond the last sequence
	// its platform's consumer delivered can no longer be delivered.
	looks := map[string]*holders{}
	for a, seq := range deleted {
		p := c.askPlatform[a]
		if p == "" {
			continue
		}
		h, ok := looks[p]
		if !ok {
			if got, err := c.platformHolders(ctx, p); err == nil {
				h = &got
			}
			looks[p] = h
		}
		if h != nil && !h.delivered(c.askShard[a], seq) {
			st.Withdrawn(a, now)
		}
	}
}

// cancelOnHolders asks the build seat's holders to cut short the asks they
// are working on (each answers failed{cancelled}).
func (c *Controller) cancelOnHolders(asks []string) {
	if len(asks) == 0 || c.lostSeat("asking holders to cancel") {
		return
	}
	data, _ := json.Marshal(mesh.Cancel{Asks: asks})
	if err := c.nc.Publish(mesh.SeatToolSubject(mesh.BuildSeat, mesh.CancelTool), data); err != nil {
		c.log.Warn("asking holders to cancel", "err", err)
	}
}

// Call sends a tool request to the controller and decodes its reply; an
// error reply is returned as a *ToolError, which errors.Is matches against
// the sentinel its code names. Without a deadline on ctx the call waits
// DefaultToolTimeout, or what seat.WithTimeout says.
func Call(ctx context.Context, nc *nats.Conn, controllerModule, tool string, req Request, opts ...seat.CallOption) (Reply, error) {
	opts = append([]seat.CallOption{seat.WithTimeout(DefaultToolTimeout)}, opts...)
	return seat.Call[Reply](ctx, nc, "the controller", toolOf(controllerModule, tool), req, toolCodes, opts...)
}
