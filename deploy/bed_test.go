package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/registry"
)

// bed is a real, enforcing NATS server: the controller and every node
// connect as the principal their derivation names, and an admin (the test)
// may do anything.
type bed struct {
	t   *testing.T
	s   *server.Server
	cat *mesh.Catalogue
	ctx context.Context
	// admin is the test's own connection.
	anc *nats.Conn
	ajs jetstream.JetStream
	// violations are the permission errors of the controller and nodes.
	violations chan error
	// creg is the registry of the last controller's metrics.
	creg *prometheus.Registry
	// known are the principals the server admits.
	known map[string]bool
}

func newBed(t *testing.T, nodes []string, extra ...mesh.Permissions) *bed {
	t.Helper()
	cat := meshtest.Catalogue(t, map[string][]string{"base": nil, "app": {"base"}})
	for _, n := range nodes {
		extra = append(extra, mesh.NodePermissions(n))
	}
	return newBedWith(t, cat, extra...)
}

// newBedWith is a bed for catalogue cat, its controller and operator, and
// the principals of sets.
func newBedWith(t *testing.T, cat *mesh.Catalogue, sets ...mesh.Permissions) *bed {
	t.Helper()
	sets = append([]mesh.Permissions{cat.ControllerPermissions("controller"), cat.OperatorPermissions("operator")}, sets...)
	users := []*server.User{{Username: "admin", Password: "pw"}}
	known := map[string]bool{}
	for _, p := range sets {
		users = append(users, &server.User{Username: p.Principal, Password: "pw", Permissions: p.ServerPermissions()})
		known[p.Principal] = true
	}
	s := natstest.Server(t, &server.Options{Users: users})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	b := &bed{t: t, s: s, cat: cat, ctx: ctx, violations: make(chan error, 64), known: known}
	b.anc, b.ajs = natstest.Connect(t, s, nats.UserInfo("admin", "pw"))
	return b
}

// connect dials as a principal; its permission errors go to errs (the bed's
// violations when nil).
func (b *bed) connect(user string, errs chan error) (*nats.Conn, jetstream.JetStream) {
	if errs == nil {
		errs = b.violations
	}
	if !b.known[user] && b.known[mesh.PrincipalID(mesh.KindNode, user)] {
		user = mesh.PrincipalID(mesh.KindNode, user) // a node, by its name
	}
	return natstest.Connect(b.t, b.s, nats.UserInfo(user, "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix(user)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
}

func (b *bed) noViolations() {
	b.t.Helper()
	select {
	case err := <-b.violations:
		b.t.Fatalf("a principal was refused: %v", err)
	default:
	}
}

type running struct {
	cancel context.CancelFunc
	done   chan error
}

func (r running) stop() error { r.cancel(); return <-r.done }

func run(ctx context.Context, fn func(context.Context) error) running {
	ctx, cancel := context.WithCancel(ctx)
	r := running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- fn(ctx) }()
	return r
}

// controller runs the fleet's controller as its principal and waits until
// it answers its tools.
func (b *bed) controller(cfg deploy.ControllerConfig) (*deploy.Metrics, running) {
	b.t.Helper()
	return b.controllerWith(cfg, nil)
}

// controllerWith is controller with the controller set up by tweak before
// it runs.
func (b *bed) controllerWith(cfg deploy.ControllerConfig, tweak func(*deploy.Controller)) (*deploy.Metrics, running) {
	b.t.Helper()
	_, js := b.connect("controller", nil)
	b.creg = prometheus.NewRegistry()
	m := deploy.NewMetrics(b.creg, "")
	c, err := deploy.NewController(cfg, js, b.cat, testLog(b.t), m)
	if err != nil {
		b.t.Fatal(err)
	}
	if tweak != nil {
		tweak(c)
	}
	r := run(b.ctx, c.Run)
	b.t.Cleanup(func() { r.cancel() })
	onc, _ := b.connect("operator", nil)
	testenv.WaitFor(b.t, 10*time.Second, "the controller to answer", func() bool {
		select {
		case err := <-r.done:
			b.t.Fatalf("controller stopped: %v", err)
		default:
		}
		_, err := deploy.Call(b.ctx, onc, mesh.NodesTool, deploy.Request{})
		return err == nil
	})
	return m, r
}

// node makes a node runtime connected as its principal.
func (b *bed) node(name, dir string, carried map[string]deploy.RunFunc) (*deploy.Node, *deploy.Metrics) {
	b.t.Helper()
	return b.nodeWith(name, dir, prometheus.NewRegistry(), func(cfg *deploy.NodeConfig) {
		if carried != nil {
			cfg.Carried = carried
		}
	})
}

// nodeWith makes a node runtime whose metrics are registered with reg,
// its config changed by set.
func (b *bed) nodeWith(name, dir string, reg prometheus.Registerer, set func(*deploy.NodeConfig)) (*deploy.Node, *deploy.Metrics) {
	b.t.Helper()
	_, js := b.connect(name, nil)
	cfg := deploy.DefaultNodeConfig()
	cfg.Name, cfg.StateDir, cfg.Platforms, cfg.Registry = name, dir, []string{"linux/amd64"}, registry.NewClient(registry.WithInsecure(true))
	cfg.Heartbeat, cfg.RetryDelay = 200*time.Millisecond, 200*time.Millisecond
	set(&cfg)
	m := deploy.NewMetrics(reg, name)
	n, err := deploy.NewNode(cfg, js, testLog(b.t), m)
	if err != nil {
		b.t.Fatal(err)
	}
	return n, m
}

// operator calls a controller tool.
func (b *bed) call(tool string, req deploy.Request) (deploy.Reply, error) {
	nc, _ := b.connect("operator", nil)
	return deploy.Call(b.ctx, nc, tool, req)
}

func (b *bed) nodes() map[string]deploy.NodeView {
	r, err := b.call(mesh.NodesTool, deploy.Request{})
	if err != nil {
		b.t.Fatal(err)
	}
	out := map[string]deploy.NodeView{}
	for _, v := range r.Nodes {
		out[v.Node] = v
	}
	return out
}

// setCurrent writes a module's current image into the controller's plans
// bucket, as cascade does when a plan settles.
func (b *bed) setCurrent(module, repo, digest string) {
	b.t.Helper()
	kv, err := b.ajs.KeyValue(b.ctx, mesh.KVBucket("build-controller", cascade.StateBucket))
	if err != nil {
		b.t.Fatal(err)
	}
	data, _ := json.Marshal(cascade.Current{Module: module, Digest: digest, Image: repo + "@" + digest, Plan: "p", Seq: 1})
	if _, err := kv.Put(b.ctx, cascade.CurrentKey(module), data); err != nil {
		b.t.Fatal(err)
	}
}

// lastDeclaration is the stream's declaration for a node; ok is false when
// it holds none.
func (b *bed) lastDeclaration(node string) (deploy.Declaration, bool) {
	st, err := b.ajs.Stream(b.ctx, mesh.NodesStream)
	if err != nil {
		b.t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(b.ctx, mesh.NodeSubject(node))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return deploy.Declaration{}, false
	}
	if err != nil {
		b.t.Fatal(err)
	}
	var d deploy.Declaration
	if err := json.Unmarshal(m.Data, &d); err != nil {
		b.t.Fatal(err)
	}
	return d, true
}

// declaredWith waits until the controller has declared module at digest
// to node and returns that declaration. (An assignment and a current image
// written together make one declaration or two, as the controller hears
// them.)
func (b *bed) declaredWith(node, module, digest string) deploy.Declaration {
	b.t.Helper()
	var d deploy.Declaration
	testenv.WaitFor(b.t, 30*time.Second, node+"'s declaration of "+module+"@"+digest, func() bool {
		d, _ = b.lastDeclaration(node)
		for _, m := range d.Modules {
			if m.Module == module && m.Digest == digest {
				return true
			}
		}
		return false
	})
	return d
}

// seatMsgs is how many messages wait in the mesh-controller seat's queue.
func (b *bed) seatMsgs() uint64 {
	st, err := b.ajs.Stream(b.ctx, mesh.SeatStream(mesh.ControllerSeat))
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := st.Info(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	return info.State.Msgs
}

func count(c prometheus.Counter) float64 { return testutil.ToFloat64(c) }

// testLog logs through t.Log, so a failing test shows what happened.
func testLog(t *testing.T) *slog.Logger { return testenv.Log(t, "deploy") }
