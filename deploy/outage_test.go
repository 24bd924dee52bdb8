package deploy_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// The fleet controller starts while the bus does not answer (a server
// restarting, a cluster regaining quorum) with a node whose consumer it
// must assert again: every assertion is retried, said in the log, until
// the server is back on the same port and store; it then asserts the
// node's consumer and serves. Before, the first timeout ("asserting node
// n1's consumer … context deadline exceeded") stopped it.
func TestTheFleetControllerRetriesItsAssertionsWhileTheBusIsAway(t *testing.T) {
	cat := meshtest.Catalogue(t, map[string][]string{"base": nil})
	sets := []mesh.Permissions{cat.ControllerPermissions("controller"), cat.OperatorPermissions("operator"), mesh.NodePermissions("n1")}
	users := []*server.User{{Username: "admin", Password: "pw"}}
	known := map[string]bool{}
	for _, p := range sets {
		users = append(users, &server.User{Username: p.Principal, Password: "pw", Permissions: p.ServerPermissions()})
		known[p.Principal] = true
	}
	opts := server.Options{Users: users, Port: natstest.FreePortRun(t, 1), StoreDir: t.TempDir()}
	s := natstest.Server(t, &opts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := &bed{t: t, s: s, cat: cat, ctx: ctx, violations: make(chan error, 64), known: known}
	b.anc, b.ajs = natstest.Connect(t, s, nats.UserInfo("admin", "pw"))
	_, first := b.controller(deploy.DefaultControllerConfig())
	n, _ := b.node("n1", t.TempDir(), nil)
	if err := n.Enrol(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	if err := b.ajs.DeleteConsumer(b.ctx, mesh.NodesStream, mesh.NodeConsumer("n1")); err != nil {
		t.Fatal(err)
	}

	// The next controller is connected, and the server goes away.
	_, js := natstest.Connect(t, s, nats.UserInfo("controller", "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix("controller")),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	var log testenv.Buffer
	c, err := deploy.NewController(deploy.DefaultControllerConfig(), js, cat, slog.New(slog.NewTextHandler(&log, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	s.WaitForShutdown()
	r := run(ctx, c.Run)
	t.Cleanup(func() { r.cancel() })
	testenv.WaitFor(t, 60*time.Second, "the controller to say the bus does not answer and retry", func() bool {
		select {
		case err := <-r.done:
			t.Fatalf("the fleet controller stopped while the bus was away: %v", err)
		default:
		}
		return strings.Contains(log.String(), "the bus did not answer; retrying")
	})

	b.s = natstest.Server(t, &opts)
	b.anc, b.ajs = natstest.Connect(t, b.s, nats.UserInfo("admin", "pw"))
	testenv.WaitFor(t, 60*time.Second, "n1's consumer asserted again", func() bool {
		select {
		case err := <-r.done:
			t.Fatalf("the fleet controller stopped: %v\n%s", err, log.String())
		default:
		}
		_, err := b.ajs.Consumer(ctx, mesh.NodesStream, mesh.NodeConsumer("n1"))
		return err == nil
	})
	onc, _ := b.connect("operator", nil)
	testenv.WaitFor(t, 30*time.Second, "the controller to answer", func() bool {
		_, err := deploy.Call(ctx, onc, mesh.NodesTool, deploy.Request{})
		return err == nil
	})
	if err := r.stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
}
