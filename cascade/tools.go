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
)

// The controller's tools (its manifest's serves), request/reply on
// mesh.mod.<controller>.tool.<name>.
const (
	ToolRebuild = "rebuild"
	ToolRetry   = "retry"
	ToolCancel  = "cancel"
)

// Request is a tool request to the controller.
type Request struct {
	// ID names a rebuild's plan: the same id twice is one plan.
	ID      string   `json:"id,omitempty"`
	Modules []string `json:"modules,omitempty"`
	Plan    string   `json:"plan,omitempty"`
	Module  string   `json:"module,omitempty"`
}

// Reply is the controller's answer.
type Reply struct {
	Plan    string     `json:"plan,omitempty"`
	Created bool       `json:"created,omitempty"`
	Record  PlanRecord `json:"record,omitzero"`
	Asks    []string   `json:"asks,omitempty"`
	Error   string     `json:"error,omitempty"`
	// Code classifies Error: "unknown-module", "no-plan", "not-failed",
	// "bad-request".
	Code string `json:"code,omitempty"`
}

// Errors a tool answers with, matched with errors.Is on the client side.
var (
	ErrUnknownModule = planner.ErrUnknownModule
	ErrBadRequest    = errors.New("bad request")
	ErrNoController  = errors.New("no controller answered")
)

var codes = map[string]error{
	"unknown-module": ErrUnknownModule, "no-plan": ErrNoPlan, "not-failed": ErrNotFailed, "bad-request": ErrBadRequest,
}

func codeOf(err error) string {
	switch {
	case errors.Is(err, planner.ErrUnknownModule), errors.Is(err, planner.ErrNotBuilt), errors.Is(err, ErrNotInPlan):
		return "unknown-module"
	case errors.Is(err, ErrNoPlan):
		return "no-plan"
	case errors.Is(err, ErrNotFailed):
		return "not-failed"
	default:
		return "bad-request"
	}
}

type command struct {
	kind  string
	req   Request
	cat   *mesh.Catalogue
	reply chan Reply
}

func (c *Controller) do(ctx context.Context, cmd command) Reply {
	cmd.reply = make(chan Reply, 1)
	select {
	case c.cmds <- cmd:
	case <-ctx.Done():
		return Reply{Error: ctx.Err().Error()}
	}
	select {
	case r := <-cmd.reply:
		return r
	case <-ctx.Done():
		return Reply{Error: ctx.Err().Error()}
	}
}

func (c *Controller) serveTools() ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	for _, tool := range []string{ToolRebuild, ToolRetry, ToolCancel} {
		subj := mesh.ModuleToolSubject(c.module, tool)
		sub, err := c.nc.Subscribe(subj, func(m *nats.Msg) {
			var req Request
			var r Reply
			if err := json.Unmarshal(m.Data, &req); err != nil {
				r = Reply{Error: fmt.Sprintf("malformed request: %v", err), Code: "bad-request"}
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				r = c.do(ctx, command{kind: tool, req: req})
				cancel()
			}
			data, _ := json.Marshal(r)
			_ = m.Respond(data)
		})
		if err != nil {
			return subs, fmt.Errorf("serving %s: %w", subj, err)
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// command runs on the controller's goroutine.
func (c *Controller) command(ctx context.Context, cmd command) Reply {
	now := time.Now().UTC()
	fail := func(err error) Reply { return Reply{Error: err.Error(), Code: codeOf(err)} }
	switch cmd.kind {
	case "catalogue":
		c.cat, c.ix = cmd.cat, planner.NewIndex(cmd.cat)
		return Reply{}
	case ToolRebuild:
		if cmd.req.ID == "" || len(cmd.req.Modules) == 0 {
			return fail(fmt.Errorf("%w: a rebuild needs a request id and modules", ErrBadRequest))
		}
		rec, created, err := c.createPlan(ctx, planner.Trigger{Kind: planner.KindRebuild, ID: cmd.req.ID, Modules: cmd.req.Modules}, now)
		if err != nil {
			return fail(err)
		}
		return Reply{Plan: rec.ID, Created: created, Record: rec}
	case ToolRetry:
		st, err := c.plan(ctx, cmd.req.Plan)
		if err != nil {
			return fail(err)
		}
		sub, err := st.Retry(cmd.req.Module, now)
		if err != nil {
			return fail(err)
		}
		c.enqueue(st, []Submit{sub})
		for _, m := range st.Modules {
			c.touch(st, m.Module)
		}
		return Reply{Plan: st.Plan, Asks: []string{sub.AskID}, Record: Record(st)}
	case ToolCancel:
		st, err := c.plan(ctx, cmd.req.Plan)
		if err != nil {
			return fail(err)
		}
		asks := st.Cancel(now)
		for _, m := range st.Modules {
			c.touch(st, m.Module)
		}
		c.cancelAsks(ctx, asks)
		return Reply{Plan: st.Plan, Asks: asks, Record: Record(st)}
	}
	return fail(fmt.Errorf("%w: unknown command %q", ErrBadRequest, cmd.kind))
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
	p, err := c.ix.Plan(r.Trigger)
	if err != nil {
		return nil, err
	}
	mods, err := c.store.Modules(ctx, id)
	if err != nil {
		return nil, err
	}
	st, err := Load(p, r, mods)
	if err != nil {
		return nil, err
	}
	c.plans[id] = st
	return st, nil
}

// cancelAsks takes a cancelled plan's queued asks out of the work queue and
// asks the holders to cut short the ones they are building.
func (c *Controller) cancelAsks(ctx context.Context, asks []string) {
	if len(asks) == 0 {
		return
	}
	if st, err := c.js.Stream(ctx, mesh.SeatStream(mesh.BuildSeat)); err == nil {
		for _, a := range asks {
			if seq, ok := c.askSeq[a]; ok {
				_ = st.DeleteMsg(ctx, seq) // gone already if a holder took it
			}
		}
	}
	data, _ := json.Marshal(mesh.Cancel{Asks: asks})
	if err := c.nc.Publish(mesh.SeatToolSubject(mesh.BuildSeat, mesh.CancelTool), data); err != nil {
		c.log.Warn("asking holders to cancel", "err", err)
	}
}

// Call sends a tool request to the controller and decodes its reply; an
// error reply is returned as an error wrapping the matching sentinel.
func Call(ctx context.Context, nc *nats.Conn, controllerModule, tool string, req Request) (Reply, error) {
	data, _ := json.Marshal(req)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	m, err := nc.RequestWithContext(ctx, mesh.ModuleToolSubject(controllerModule, tool), data)
	if errors.Is(err, nats.ErrNoResponders) {
		return Reply{}, fmt.Errorf("%w: is build-controller running? (%s)", ErrNoController, mesh.ModuleToolSubject(controllerModule, tool))
	}
	if err != nil {
		return Reply{}, fmt.Errorf("asking the controller to %s: %w", tool, err)
	}
	var r Reply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return Reply{}, fmt.Errorf("decoding the controller's answer: %w", err)
	}
	if r.Error != "" {
		if s, ok := codes[r.Code]; ok {
			return r, fmt.Errorf("%w: %s", s, r.Error)
		}
		return r, errors.New(r.Error)
	}
	return r, nil
}
