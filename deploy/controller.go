package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/kvsnap"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/seat"
)

// ControllerConfig configures the fleet's side of the controller.
// DefaultControllerConfig fills the defaults.
type ControllerConfig struct {
	// Module is the catalogue module the controller runs as; empty means
	// the one that holds mesh-controller and declares state declarations.
	Module string
	// Replicas of the node consumers the controller creates.
	Replicas int
	// PullFor is how long each pull of the seat's consumer waits
	// (seat.PullForLease of the seat claim's lease); 0 is seat's default.
	PullFor time.Duration
	// ReportDelay is how long a report the store could not take waits
	// before it is delivered again.
	ReportDelay time.Duration
	// ReportBound is how long the store window holds a report (from when
	// it was published) before it is let go.
	ReportBound time.Duration
	// OnlineWithin: a node heard from within it is online.
	OnlineWithin time.Duration
	// ToolTimeout bounds the controller's work on one tool request; 0 is
	// seat.DefaultToolTimeout.
	ToolTimeout time.Duration
	// Raise asserts the catalogue's wire (with the declarations stream) on
	// start. Off where another part of the process raised it already
	// (cascade.Controller in build-controller): two raises at once race.
	Raise bool
}

// DefaultControllerConfig returns the defaults.
func DefaultControllerConfig() ControllerConfig {
	return ControllerConfig{Replicas: 1, ReportDelay: 5 * time.Second, ReportBound: time.Hour, OnlineWithin: 90 * time.Second,
		ToolTimeout: seat.DefaultToolTimeout, Raise: true}
}

// ErrConfig is wrapped by every refusal of a configuration.
var ErrConfig = errors.New("invalid deploy config")

// Controller keeps the fleet: it enrols nodes on the mesh-controller seat,
// keeps assignments, composes each affected node's declaration when an
// assignment or a module's current image changes, and hears the nodes'
// reports through the store window. One goroutine owns all of its state;
// tool requests reach it by channel. It runs beside cascade.Controller in
// the build-controller process.
type Controller struct {
	cfg    ControllerConfig
	js     jetstream.JetStream
	nc     *nats.Conn
	log    *slog.Logger
	obs    Observer
	module string
	cat    *mesh.Catalogue

	store  *Store
	nodes  map[string]NodeRecord
	assign map[string]Assignment
	decl   map[string]Declaration
	status map[string]Status
	heard  map[string]Report
	// applied is the revision each node said it had applied when it
	// enrolled: its next declaration is numbered above it, whatever the
	// store remembers (a store lost with the bus's starts again from 0).
	applied map[string]uint64
	// current is each module's current image from the plans bucket.
	current map[string]cascade.Current
	cmds    seat.Inbox[command, Reply]
	// held says whether the controller still holds its seat (SetHeld).
	held claim.Holding
}

// SetHeld sets what says whether this controller still holds its seat
// (claim.Lease.Held), asked before every write of the fleet's state and
// so before every declaration published (cascade.Controller.SetHeld says
// why); call it before Run.
func (c *Controller) SetHeld(held func() error) { c.held = held }

// NewController returns the fleet's controller for a checked catalogue.
func NewController(cfg ControllerConfig, js jetstream.JetStream, cat *mesh.Catalogue, log *slog.Logger, obs Observer) (*Controller, error) {
	def := DefaultControllerConfig()
	if cfg.Replicas < 1 {
		cfg.Replicas = 1
	}
	if cfg.ReportDelay <= 0 {
		cfg.ReportDelay = def.ReportDelay
	}
	if cfg.ReportBound <= 0 {
		cfg.ReportBound = def.ReportBound
	}
	if cfg.OnlineWithin <= 0 {
		cfg.OnlineWithin = def.OnlineWithin
	}
	if cfg.ToolTimeout <= 0 {
		cfg.ToolTimeout = def.ToolTimeout
	}
	if js == nil || cat == nil {
		return nil, fmt.Errorf("%w: a JetStream handle and a catalogue are required", ErrConfig)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if obs == nil {
		obs = nopObserver{}
	}
	module, err := controllerModule(cat, cfg.Module)
	if err != nil {
		return nil, err
	}
	return &Controller{
		cfg: cfg, js: js, nc: js.Conn(), log: log, obs: obs, module: module, cat: cat,
		nodes: map[string]NodeRecord{}, assign: map[string]Assignment{}, decl: map[string]Declaration{},
		status: map[string]Status{}, heard: map[string]Report{}, applied: map[string]uint64{}, current: map[string]cascade.Current{},
		cmds: make(seat.Inbox[command, Reply], 16),
	}, nil
}

func controllerModule(cat *mesh.Catalogue, name string) (string, error) {
	if m, ok := seat.ControllerModule(cat, name, StateBucket); ok {
		return m, nil
	}
	return "", fmt.Errorf("%w: no module holds %s with state %q: add `state: [{name: %s, history: 1}]` to the controller's manifest",
		ErrConfig, mesh.ControllerSeat, StateBucket, StateBucket)
}

// Run raises the catalogue (with the declarations stream), asserts every
// recorded node's consumer, and works enrolments, reports, assignments and
// image changes until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	// Every assertion and read of the start is retried while the bus does
	// not answer (a cluster regaining quorum), as the catalogue's raise
	// is: one timeout does not stop the fleet.
	if c.cfg.Raise {
		if err := c.retry(ctx, "raising the catalogue", c.raise); err != nil {
			return err
		}
	}
	if err := c.retry(ctx, "opening the fleet's store", func(ctx context.Context) (err error) {
		c.store, err = OpenStore(ctx, c.js, c.module)
		if err == nil {
			c.store.held = c.held
		}
		return err
	}); err != nil {
		return err
	}
	if err := c.retry(ctx, "loading the fleet", c.load); err != nil {
		return err
	}
	currents, err := c.watchCurrents(ctx)
	if err != nil {
		return err
	}
	defer currents.Stop()
	subs, err := c.serveTools()
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	if err != nil {
		return err
	}
	var seatMsgs *seat.Consumption
	if err := c.retry(ctx, "binding the "+mesh.ControllerSeat+" seat's consumer", func(ctx context.Context) (err error) {
		seatMsgs, err = seat.Consume(ctx, c.js, mesh.SeatStream(mesh.ControllerSeat), mesh.SeatConsumer(mesh.ControllerSeat), 64, "the "+mesh.ControllerSeat+" seat", c.log, seat.PullingFor(c.cfg.PullFor))
		return err
	}); err != nil {
		return err
	}
	defer seatMsgs.Stop()
	c.log.Info("fleet controller running", "nodes", len(c.nodes), "assignments", len(c.assign))
	return c.loop(ctx, seatMsgs.Messages(), currents.Updates())
}

// watchCurrents watches the current image of every module in the plans
// bucket.
func (c *Controller) watchCurrents(ctx context.Context) (*kvsnap.Watcher, error) {
	var currents *kvsnap.Watcher
	err := c.retry(ctx, "watching current images", func(ctx context.Context) error {
		plans, err := seat.OpenBucket(ctx, c.js, c.module, cascade.StateBucket)
		if err != nil {
			return fmt.Errorf("reading current images: %w", err)
		}
		if currents, err = kvsnap.New(c.js, plans).Watch(ctx, []string{cascade.CurrentKey("*")}); err != nil {
			return fmt.Errorf("watching current images: %w", err)
		}
		return nil
	})
	return currents, err
}

// loop works the seat's messages, current images and tool requests on the
// controller's goroutine until ctx is done.
func (c *Controller) loop(ctx context.Context, msgs <-chan jetstream.Msg, currents <-chan jetstream.KeyValueEntry) error {
	caughtUp := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				if ctx.Err() != nil {
					return nil // stopping: the consumer ends with it
				}
				return errors.New("the seat's consumer stopped")
			}
			c.handle(ctx, m)
		case e, ok := <-currents:
			if !ok {
				if ctx.Err() != nil {
					return nil // stopping: the watch ends with it
				}
				return errors.New("the watch of current images stopped")
			}
			if e == nil {
				caughtUp = true
				c.reconcile(ctx, "")
				continue
			}
			c.currentImage(ctx, e, caughtUp)
		case cmd := <-c.cmds:
			cmd.Answer(c.command(ctx, cmd.Q))
		}
	}
}

// currentImage records a module's current image; once the watch has caught
// up, a new digest is declared to the nodes the module is assigned to.
func (c *Controller) currentImage(ctx context.Context, e jetstream.KeyValueEntry, caughtUp bool) {
	if e.Operation() != jetstream.KeyValuePut {
		return // a module's current image is replaced, never taken away
	}
	var cur cascade.Current
	if err := json.Unmarshal(e.Value(), &cur); err != nil {
		c.log.Warn("ignoring an unreadable current image", "key", e.Key(), "err", err)
		return
	}
	module := strings.TrimPrefix(e.Key(), cascade.CurrentKey(""))
	prev := c.current[module]
	c.current[module] = cur
	if caughtUp && prev.Digest != cur.Digest {
		c.reconcile(ctx, module)
	}
}

// retry runs fn, again (with backoff, said in the log) while the bus does
// not answer in time (mesh.Unanswered); a refusal, or ctx done, returns
// its error at once.
func (c *Controller) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	return mesh.Answered(ctx, c.log, what, func() error { return fn(ctx) })
}

// raise asserts the catalogue's wire.
func (c *Controller) raise(ctx context.Context) error {
	r, err := mesh.Raise(ctx, c.js, c.cat, c.cfg.Replicas)
	for _, o := range r.Orphans {
		c.log.Warn("declaration gone; kept, not deleted", "what", o)
	}
	return err
}

// load reads the fleet from the store and asserts every recorded node's
// consumer: a mesh restored from a backup has node records and no consumers.
func (c *Controller) load(ctx context.Context) error {
	var err error
	if c.nodes, err = c.store.Nodes(ctx); err != nil {
		return err
	}
	if c.assign, err = c.store.Assignments(ctx); err != nil {
		return err
	}
	if c.decl, err = c.store.Declarations(ctx); err != nil {
		return err
	}
	if c.status, err = c.store.Statuses(ctx); err != nil {
		return err
	}
	for _, name := range sortedKeys(c.nodes) {
		if err := c.assertConsumer(ctx, name); err != nil {
			return err
		}
		c.observe(name)
	}
	return nil
}

func (c *Controller) assertConsumer(ctx context.Context, node string) error {
	spec := mesh.NodeConsumerSpec(node, c.cfg.Replicas)
	if _, err := c.js.CreateOrUpdateConsumer(ctx, spec.Stream, spec.Config); err != nil {
		return fmt.Errorf("asserting node %s's consumer %s on %s: %w", node, spec.Config.Durable, spec.Stream, err)
	}
	return nil
}

// handle works one message of the seat's work queue.
func (c *Controller) handle(ctx context.Context, m jetstream.Msg) {
	switch m.Subject() {
	case mesh.SeatAcceptSubject(mesh.ControllerSeat, mesh.EnrolVerb):
		c.enrol(ctx, m)
	case mesh.SeatAcceptSubject(mesh.ControllerSeat, mesh.ReportVerb):
		c.report(ctx, m)
	default:
		c.log.Warn("refusing work the seat does not accept", "subject", m.Subject())
		_ = m.Term()
	}
}

// hold is the store window: a message the store could not take is delivered
// again after a delay, until the bound (counted from when it was published)
// passes; then it is let go, and said so.
func (c *Controller) hold(m jetstream.Msg, kind string, err error) {
	md, merr := m.Metadata()
	if merr == nil && time.Since(md.Timestamp) > c.cfg.ReportBound {
		c.log.Error("the store never took it; letting it go", "kind", kind, "subject", m.Subject(),
			"published", md.Timestamp, "bound", c.cfg.ReportBound, "err", err)
		c.obs.Report(kind, "let-go")
		_ = m.Term()
		return
	}
	c.log.Warn("the store cannot take it; held", "kind", kind, "retry", c.cfg.ReportDelay, "err", err)
	c.obs.Report(kind, "held")
	_ = m.NakWithDelay(c.cfg.ReportDelay)
}

func (c *Controller) enrol(ctx context.Context, m jetstream.Msg) {
	var e Enrol
	if err := decode(m.Data(), &e); err != nil {
		c.log.Warn("refusing an enrolment", "err", err)
		_ = m.Term()
		return
	}
	if err := e.Validate(); err != nil {
		c.log.Warn("refusing an enrolment", "err", err)
		if underAnswer(e.Node, e.Reply) {
			c.answer(e.Reply, EnrolAnswer{Node: e.Node, Error: err.Error()})
		}
		_ = m.Term()
		return
	}
	now := time.Now().UTC()
	rec, known := c.nodes[e.Node]
	if known && rec.Identity != e.Identity {
		c.log.Warn("refusing an enrolment: the name is held by another machine", "node", e.Node, "holder", rec.Identity, "asker", e.Identity)
		c.answer(e.Reply, EnrolAnswer{Node: e.Node, Holder: rec.Identity, Since: rec.Enrolled,
			Error: fmt.Sprintf("node name %s is enrolled by machine %s since %s: choose another --name on this machine, or remove the old one's state",
				e.Node, rec.Identity, rec.Enrolled.Format(time.RFC3339))})
		_ = m.Ack()
		return
	}
	next := NodeRecord{Node: e.Node, Identity: e.Identity, Platforms: e.Platforms, Enrolled: now, Updated: now}
	if known {
		next.Enrolled = rec.Enrolled
	}
	if !known || !slices.Equal(rec.Platforms, e.Platforms) {
		if err := c.store.put(ctx, NodeKey(e.Node), next); err != nil {
			c.hold(m, mesh.EnrolVerb, err)
			return
		}
	}
	if err := c.assertConsumer(ctx, e.Node); err != nil {
		c.hold(m, mesh.EnrolVerb, err)
		return
	}
	c.nodes[e.Node] = next
	if e.Applied < math.MaxUint64/2 { // room to count on from it
		c.applied[e.Node] = e.Applied
	}
	c.observe(e.Node)
	c.answer(e.Reply, EnrolAnswer{Node: e.Node, OK: true, Created: !known})
	if !known {
		c.log.Info("node enrolled", "node", e.Node, "platforms", e.Platforms)
	}
	_ = m.Ack()
}

func (c *Controller) answer(reply string, a EnrolAnswer) {
	data, _ := json.Marshal(a)
	if err := c.nc.Publish(reply, data); err != nil {
		c.log.Warn("answering an enrolment", "node", a.Node, "err", err)
	}
}

func (c *Controller) report(ctx context.Context, m jetstream.Msg) {
	var r Report
	err := decode(m.Data(), &r)
	if err == nil {
		err = r.Validate()
	}
	if err != nil {
		c.log.Warn("refusing a report", "err", err)
		_ = m.Term()
		return
	}
	if r.Kind == Heartbeat {
		c.heard[r.Node] = r
		c.obs.Report(r.Kind, "heard")
		if _, ok := c.nodes[r.Node]; ok {
			c.observe(r.Node)
		}
		_ = m.Ack()
		return
	}
	if _, ok := c.nodes[r.Node]; !ok {
		c.log.Warn("refusing a report from a node that is not enrolled", "node", r.Node, "kind", r.Kind)
		_ = m.Term()
		return
	}
	if d, ok := c.decl[r.Node]; ok && r.Revision < d.Revision {
		c.log.Debug("report about a superseded declaration; settled", "node", r.Node, "revision", r.Revision, "declared", d.Revision)
		c.obs.Report(r.Kind, "superseded")
		_ = m.Ack()
		return
	}
	st := Status{Node: r.Node, Kind: r.Kind, Revision: r.Revision, Applied: r.Applied, Modules: r.Modules,
		Reason: r.Reason, Took: r.Took, At: r.At}
	if err := c.store.put(ctx, StatusKey(r.Node), st); err != nil {
		c.hold(m, r.Kind, err)
		return
	}
	c.status[r.Node] = st
	c.heard[r.Node] = r
	c.obs.Report(r.Kind, "recorded")
	c.observe(r.Node)
	if r.Kind != Applied {
		c.log.Warn("node did not apply its declaration", "node", r.Node, "kind", r.Kind, "revision", r.Revision, "reason", r.Reason)
	}
	_ = m.Ack()
}

// compose is node n's declaration as the assignments and current images say
// now, at the next revision.
func (c *Controller) compose(node string) Declaration {
	d := Declaration{Version: WireVersion, Node: node, Revision: max(c.decl[node].Revision, c.applied[node]) + 1, Modules: []DeclaredModule{}}
	for _, module := range sortedKeys(c.assign) {
		if !slices.Contains(c.assign[module].Nodes, node) {
			continue
		}
		dm := DeclaredModule{Module: module}
		if cur, ok := c.current[module]; ok {
			dm.Image, _, _ = strings.Cut(cur.Image, "@")
			dm.Digest = cur.Digest
		}
		if man, ok := c.cat.Module(module); ok {
			for _, s := range c.cat.HeldSeats(man) {
				dm.Seats = append(dm.Seats, Seat{Seat: s.Seat, Scope: s.Scope})
			}
			dm.Buckets = c.cat.IssuedBuckets(man)
		}
		d.Modules = append(d.Modules, dm)
	}
	return d
}

func sameModules(a, b Declaration) bool {
	data1, _ := json.Marshal(a.Modules)
	data2, _ := json.Marshal(b.Modules)
	return string(data1) == string(data2)
}

// reconcile publishes a new declaration to every node whose declaration
// would change: those with module assigned ("" for every node). A node whose
// stream subject is empty (a restored mesh) is given its declaration again.
func (c *Controller) reconcile(ctx context.Context, module string) []Declaration {
	var out []Declaration
	for _, node := range sortedKeys(c.nodes) {
		if module != "" && !slices.Contains(c.assign[module].Nodes, node) {
			continue
		}
		d := c.compose(node)
		prev, had := c.decl[node]
		if had && sameModules(prev, d) && (module != "" || c.published(ctx, node, prev.Revision)) {
			continue
		}
		if !had && len(d.Modules) == 0 {
			continue
		}
		if err := c.publish(ctx, d); err != nil {
			c.log.Error("publishing a declaration", "node", node, "revision", d.Revision, "err", err)
			continue
		}
		out = append(out, d)
	}
	return out
}

// published reports whether the stream holds node n's declaration at rev or
// later.
func (c *Controller) published(ctx context.Context, node string, rev uint64) bool {
	st, err := c.js.Stream(ctx, mesh.NodesStream)
	if err != nil {
		return false
	}
	msg, err := st.GetLastMsgForSubject(ctx, mesh.NodeSubject(node))
	if err != nil {
		return false
	}
	var d Declaration
	return json.Unmarshal(msg.Data, &d) == nil && d.Revision >= rev
}

// publish records a declaration, then publishes it on the node's subject.
func (c *Controller) publish(ctx context.Context, d Declaration) error {
	d.Composed = time.Now().UTC()
	if err := c.store.put(ctx, DeclKey(d.Node), d); err != nil {
		return err
	}
	c.decl[d.Node] = d
	c.observe(d.Node)
	data, _ := json.Marshal(d)
	if _, err := c.js.Publish(ctx, mesh.NodeSubject(d.Node), data); err != nil {
		return fmt.Errorf("publishing on %s: %w", mesh.NodeSubject(d.Node), err)
	}
	c.log.Info("declared", "node", d.Node, "revision", d.Revision, "modules", len(d.Modules))
	return nil
}

// SetCatalogue swaps in a changed catalogue (raised by the caller).
func (c *Controller) SetCatalogue(ctx context.Context, cat *mesh.Catalogue) error {
	return seat.SetCatalogue(ctx, c.cmds, cat)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
