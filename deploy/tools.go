package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/seat"
)

// Request is a tool request to the mesh-controller seat.
type Request struct {
	Module string   `json:"module,omitempty"`
	Nodes  []string `json:"nodes,omitempty"`
}

// Reply is the controller's answer to a tool request.
type Reply struct {
	Nodes      []NodeView    `json:"nodes,omitempty"`
	Assignment *Assignment   `json:"assignment,omitempty"`
	Declared   []Declaration `json:"declared,omitempty"`
	Seats      []SeatView    `json:"seats,omitempty"`
	Error      string        `json:"error,omitempty"`
	// Code classifies Error: "unknown-module", "unknown-node",
	// "one-node-only", "bad-request".
	Code string `json:"code,omitempty"`
}

// NodeView is a node as `builds nodes` shows it.
type NodeView struct {
	Node      string       `json:"node"`
	Identity  string       `json:"identity"`
	Online    bool         `json:"online"`
	Platforms []string     `json:"platforms,omitempty"`
	Enrolled  time.Time    `json:"enrolled"`
	Heartbeat time.Time    `json:"heartbeat,omitzero"`
	Declared  uint64       `json:"declared"`
	Applied   uint64       `json:"applied"`
	Outcome   string       `json:"outcome,omitempty"`
	Reason    string       `json:"reason,omitempty"`
	Modules   []ModuleView `json:"modules"`
}

// ModuleView is one module on a node: the digest declared and the one the
// node last reported applied.
type ModuleView struct {
	Module   string `json:"module"`
	Declared string `json:"declared,omitempty"`
	Applied  string `json:"applied,omitempty"`
	Carried  bool   `json:"carried,omitempty"`
}

// Errors a tool answers with, matched with errors.Is on the client side.
var (
	ErrUnknownModule = errors.New("unknown module")
	ErrUnknownNode   = errors.New("unknown node")
	ErrOneNodeOnly   = errors.New("a module holding a mesh-scoped seat goes to one node only")
	ErrBadRequest    = errors.New("bad request")
	ErrNoController  = seat.ErrNoController
)

// codes is the tools' error-code table (seat.Codes): the first entry whose
// sentinel an error wraps is its code; an error none matches is
// bad-request.
var codes = seat.Codes{
	{Code: "unknown-module", Sentinels: []error{ErrUnknownModule}},
	{Code: "unknown-node", Sentinels: []error{ErrUnknownNode}},
	{Code: "one-node-only", Sentinels: []error{ErrOneNodeOnly}},
	{Code: "bad-request", Sentinels: []error{ErrBadRequest}},
}

func codeOf(err error) string {
	if code := codes.Of(err); code != "" {
		return code
	}
	return "bad-request"
}

// Failure is the reply's error and its code (seat.Answer).
func (r Reply) Failure() (message, code string) { return r.Error, r.Code }

// command is a tool's request or a changed catalogue, handed to the
// controller's goroutine.
type command = seat.Command[Request]

func (c *Controller) serveTools() ([]*nats.Subscription, error) {
	var tools []seat.Tool
	for _, name := range []string{mesh.NodesTool, mesh.AssignTool, mesh.UnassignTool, mesh.SeatsTool} {
		tools = append(tools, toolOf(name))
	}
	return seat.ServeInbox(c.nc, tools, c.cfg.ToolTimeout, c.cmds,
		func(err error) Reply { return Reply{Error: err.Error()} },
		func(err error) Reply {
			return Reply{Error: fmt.Sprintf("malformed request: %v", err), Code: "bad-request"}
		})
}

// toolOf is the mesh-controller seat's tool by name.
func toolOf(name string) seat.Tool {
	return seat.Tool{Name: name, Subject: mesh.SeatToolSubject(mesh.ControllerSeat, name)}
}

// command runs on the controller's goroutine.
func (c *Controller) command(ctx context.Context, cmd command) Reply {
	fail := func(err error) Reply { return Reply{Error: err.Error(), Code: codeOf(err)} }
	switch cmd.Kind {
	case "catalogue":
		c.cat = cmd.Cat
		// What a module is issued follows its manifest: a node whose
		// modules' buckets changed is given its new declaration.
		c.reconcile(ctx, "")
		return Reply{}
	case mesh.NodesTool:
		return Reply{Nodes: c.views()}
	case mesh.SeatsTool:
		return Reply{Seats: c.seats(ctx)}
	case mesh.AssignTool, mesh.UnassignTool:
		a, left, err := c.change(ctx, cmd.Kind == mesh.AssignTool, cmd.Req)
		if err != nil {
			return fail(err)
		}
		return Reply{Assignment: &a, Declared: append(left, c.reconcile(ctx, cmd.Req.Module)...)}
	}
	return fail(fmt.Errorf("%w: unknown command %q", ErrBadRequest, cmd.Kind))
}

// change checks and records an assignment change and declares the nodes the
// module left; the caller declares the nodes it is assigned to.
func (c *Controller) change(ctx context.Context, assign bool, req Request) (Assignment, []Declaration, error) {
	if req.Module == "" || len(req.Nodes) == 0 {
		return Assignment{}, nil, fmt.Errorf("%w: name a module and at least one node: builds assign MODULE NODE…", ErrBadRequest)
	}
	man, ok := c.cat.Module(req.Module)
	if !ok {
		return Assignment{}, nil, fmt.Errorf("%w %q: the catalogue has no such module; see `builds catalogue check DIR` for the modules it has", ErrUnknownModule, req.Module)
	}
	cur := c.assign[req.Module]
	nodes := slices.Clone(cur.Nodes)
	for _, n := range req.Nodes {
		if assign {
			if _, ok := c.nodes[n]; !ok {
				return Assignment{}, nil, fmt.Errorf("%w %q: no node enrolled by that name; start `mesh-node --name %s` on the machine (enrolled: %s)",
					ErrUnknownNode, n, n, orNone(sortedKeys(c.nodes)))
			}
			if !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
		} else {
			if !slices.Contains(nodes, n) {
				return Assignment{}, nil, fmt.Errorf("%w %q: %s is not assigned there (assigned to: %s)", ErrUnknownNode, n, req.Module, orNone(cur.Nodes))
			}
			nodes = slices.DeleteFunc(nodes, func(x string) bool { return x == n })
		}
	}
	slices.Sort(nodes)
	if assign && len(nodes) > 1 {
		for _, s := range c.cat.HeldSeats(man) {
			if s.Scope == mesh.ScopeMesh {
				return Assignment{}, nil, fmt.Errorf("%w: %s holds the mesh-scoped seat %s, which has one holder in the mesh; it is assigned to %s: `builds unassign %s %s` first",
					ErrOneNodeOnly, req.Module, s.Seat, orNone(cur.Nodes), req.Module, strings.Join(cur.Nodes, " "))
			}
		}
	}
	a := Assignment{Module: req.Module, Nodes: nodes, Updated: time.Now().UTC()}
	if len(nodes) == 0 {
		if err := c.store.held.Err(); err != nil {
			return Assignment{}, nil, fmt.Errorf("removing the assignment of %s: %w", req.Module, err)
		}
		if err := c.store.kv.Delete(ctx, AssignKey(req.Module)); err != nil {
			return Assignment{}, nil, fmt.Errorf("removing the assignment of %s: %w", req.Module, err)
		}
		delete(c.assign, req.Module)
	} else {
		if err := c.store.put(ctx, AssignKey(req.Module), a); err != nil {
			return Assignment{}, nil, err
		}
		c.assign[req.Module] = a
	}
	// The nodes the module left get their declaration without it.
	left := c.reconcileNodes(ctx, slices.DeleteFunc(slices.Clone(cur.Nodes), func(n string) bool { return slices.Contains(nodes, n) }))
	return a, left, nil
}

// reconcileNodes recomposes the declarations of nodes a module left.
func (c *Controller) reconcileNodes(ctx context.Context, nodes []string) []Declaration {
	var out []Declaration
	for _, n := range nodes {
		if _, ok := c.nodes[n]; !ok {
			continue
		}
		d := c.compose(n)
		if prev, had := c.decl[n]; had && sameModules(prev, d) {
			continue
		}
		if err := c.publish(ctx, d); err != nil {
			c.log.Error("publishing a declaration", "node", n, "err", err)
			continue
		}
		out = append(out, d)
	}
	return out
}

func orNone(ss []string) string {
	if len(ss) == 0 {
		return "none"
	}
	return strings.Join(ss, ", ")
}

// views is the fleet as `builds nodes` shows it.
func (c *Controller) views() []NodeView {
	now := time.Now()
	out := []NodeView{}
	for _, name := range sortedKeys(c.nodes) {
		rec := c.nodes[name]
		v := NodeView{Node: name, Identity: rec.Identity, Platforms: rec.Platforms, Enrolled: rec.Enrolled, Modules: []ModuleView{}}
		v.Declared, v.Applied, v.Heartbeat = c.revisions(name)
		v.Online = !v.Heartbeat.IsZero() && now.Sub(v.Heartbeat) < c.cfg.OnlineWithin
		applied := map[string]AppliedModule{}
		if st, ok := c.status[name]; ok {
			v.Outcome, v.Reason = st.Kind, st.Reason
			for _, m := range st.Modules {
				applied[m.Module] = m
			}
		}
		for _, m := range c.decl[name].Modules {
			a := applied[m.Module]
			v.Modules = append(v.Modules, ModuleView{Module: m.Module, Declared: m.Digest, Applied: a.Digest, Carried: a.Carried})
		}
		out = append(out, v)
	}
	return out
}

// revisions is what the controller knows of node's revisions: the one
// declared to it, the newest it said it applied (in its last report of a
// declaration or its last heartbeat), and when it was last heard from.
func (c *Controller) revisions(node string) (declared, applied uint64, heard time.Time) {
	declared = c.decl[node].Revision
	if h, ok := c.heard[node]; ok {
		applied, heard = h.Applied, h.At
	}
	if st, ok := c.status[node]; ok {
		applied = max(applied, st.Applied)
	}
	return declared, applied, heard
}

// observe tells the observer what the controller knows of node now.
func (c *Controller) observe(node string) {
	declared, applied, heard := c.revisions(node)
	c.obs.NodeSeen(node, declared, applied, heard)
}

// Call sends a tool request to the mesh-controller seat and decodes its
// reply; an error reply is returned as a *seat.Error, which errors.Is
// matches against the sentinel its code names. Without a deadline on ctx
// the call waits seat.DefaultToolTimeout, or what seat.WithTimeout says.
func Call(ctx context.Context, nc *nats.Conn, tool string, req Request, opts ...seat.CallOption) (Reply, error) {
	return seat.Call[Reply](ctx, nc, mesh.ControllerSeat, toolOf(tool), req, codes, opts...)
}
