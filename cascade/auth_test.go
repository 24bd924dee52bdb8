package cascade_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
)

// TestTheFarmRunsUnderItsDerivedPermissions runs the controller, two agents
// and mesh-git's holder each as the principal its declaration derives, on a
// server that enforces those sets and nothing more: a push is planned, built
// through a cascade, retried and cancelled without one permissions
// violation. A grant missing from a derivation fails here.
func TestTheFarmRunsUnderItsDerivedPermissions(t *testing.T) {
	cat := meshtest.Catalogue(t, map[string][]string{"a": nil, "b": {"a"}, "c": {"a"}, "d": {"b", "c"}, "slow": {"a"}})
	gitModule, _ := cat.Module("git")
	m1, _ := cat.MachinePermissions("m1")
	m2, _ := cat.MachinePermissions("m2")
	sets := []mesh.Permissions{
		cat.ControllerPermissions("controller"),
		m1, m2,
		cat.ModulePermissions(gitModule),
		cat.OperatorPermissions("operator"),
	}
	var users []*server.User
	for _, p := range sets {
		users = append(users, &server.User{Username: p.Principal, Password: "pw", Permissions: p.ServerPermissions()})
	}
	s := natstest.Server(t, &server.Options{Users: users})

	violations := make(chan error, 16)
	var conns []*nats.Conn
	connect := func(user string) (*nats.Conn, jetstream.JetStream) {
		nc, js := natstest.Connect(t, s, nats.UserInfo(user, "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix(user)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case violations <- err:
				default:
				}
			}))
		conns = append(conns, nc)
		return nc, js
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, cjs := connect("controller")
	c, err := cascade.New(cascade.Config{Registry: "127.0.0.1:1", Images: testenv.AnyImage{}}, cjs, cat, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	w := newWork()
	w.fail["c"] = 1
	w.sleep["slow"] = time.Minute
	for _, m := range []string{"m1", "m2"} {
		_, ajs := connect(mesh.PrincipalID(mesh.KindAgent, m))
		cfg := agent.DefaultConfig()
		cfg.Machine, cfg.FetchWait = m, 500*time.Millisecond
		a, err := agent.New(cfg, ajs, w, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		adone := make(chan struct{})
		go func() { defer close(adone); _ = a.Run(ctx) }()
		defer func() { cancel(); <-adone }()
	}

	// The operator's CLI reads plans and calls the controller's tools.
	cnc, ojs := connect("operator")
	var store *cascade.Store
	testenv.WaitFor(t, 10*time.Second, "the operator to open the plans", func() bool {
		store, err = cascade.OpenStore(ctx, ojs, "build-controller")
		return err == nil
	})
	// mesh-git's holder announces the push.
	_, gjs := connect(mesh.PrincipalID(mesh.KindModule, "git"))
	ev := mesh.Pushed{Version: 1, Repo: repo, Commit: "c1", At: time.Now().UTC()}
	data, _ := json.Marshal(ev)
	plan := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: "c1"})
	if _, err := gjs.Publish(ctx, mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID(plan)); err != nil {
		t.Fatalf("git announcing a push under its grant: %v", err)
	}
	module := func(m string) cascade.ModuleStatus {
		mods, _ := store.Modules(ctx, plan)
		return mods[m]
	}
	testenv.WaitFor(t, 20*time.Second, "c to fail and slow to build", func() bool {
		return module("c").State == cascade.Failed && module("slow").State == cascade.Building
	})
	if _, err := cascade.Call(ctx, cnc, "build-controller", cascade.ToolRetry, cascade.Request{Plan: plan, Module: "c"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "d to be built after the retry", func() bool { return module("d").State == cascade.Built })
	statuses, err := agent.AskStatus(ctx, cnc, time.Second)
	if err != nil || len(statuses) != 2 {
		t.Fatalf("status tool under the operator's grant: %v %+v", err, statuses)
	}
	if _, err := cascade.Call(ctx, cnc, "build-controller", cascade.ToolCancel, cascade.Request{Plan: plan}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "slow to be cancelled", func() bool { return module("slow").State == cascade.Cancelled })
	rec, err := store.Plan(ctx, plan)
	if err != nil || rec.Outcome != cascade.OutcomeCancelled || rec.Counts.Built != 4 {
		t.Fatalf("plan %+v %v", rec, err)
	}
	// A violation reaches a connection before the answer to a ping it
	// sends after the refused operation: flush every connection, so that
	// each refusal so far is in the channel, then look.
	for _, nc := range conns {
		if err := nc.Flush(); err != nil {
			t.Fatalf("flushing %s: %v", nc.Opts.User, err)
		}
	}
	select {
	case err := <-violations:
		t.Fatalf("a principal was refused: %v", err)
	default:
	}
}
