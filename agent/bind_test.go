package agent_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// An agent given platforms its principal has no grant for (the catalogue
// builds none of them, so they have no queue and no permission) starts at
// once: the server answers a denied consumer lookup only with a
// permissions error on the connection, so each waits out the request's
// timeout (5s), and those no longer delay the platform it may bind. Its
// status names the queue it holds, apart from every platform it would
// build; and it builds asks of that platform.
func TestUngrantedPlatformsDoNotDelayTheStart(t *testing.T) {
	cat := meshtest.Catalogue(t, map[string][]string{"tool": nil}) // linux/amd64 only
	machine, err := cat.MachinePermissions("wide")
	if err != nil {
		t.Fatal(err)
	}
	var users []*server.User
	for _, p := range []mesh.Permissions{cat.ControllerPermissions(mesh.ControllerPrincipal), machine, cat.OperatorPermissions(mesh.OperatorPrincipal)} {
		users = append(users, &server.User{Username: p.Principal, Password: "pw", Permissions: p.ServerPermissions()})
	}
	s := natstest.Server(t, &server.Options{Users: users})
	connect := func(user string) (*nats.Conn, jetstream.JetStream) {
		return natstest.Connect(t, s, nats.UserInfo(user, "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix(user)),
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, cjs := connect(mesh.ControllerPrincipal)
	if _, err := mesh.Raise(ctx, cjs, cat, 1); err != nil {
		t.Fatal(err)
	}
	onc, _ := connect(mesh.OperatorPrincipal)
	_, ajs := connect(machine.Principal)

	cfg := agent.DefaultConfig()
	cfg.Machine, cfg.FetchWait = "wide", 500*time.Millisecond
	// The ungranted ones first: bound one after the other, each would
	// hold the start up by the request timeout.
	cfg.Platforms = []string{"linux/386", "linux/arm64", "linux/amd64"}
	g := newGate()
	a, err := agent.New(cfg, ajs, g.on("wide"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	begun := time.Now()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var st agent.Status
	testenv.WaitFor(t, 30*time.Second, "the agent answers its status", func() bool {
		sts, _ := agent.AskStatus(ctx, onc, 100*time.Millisecond)
		if len(sts) == 1 {
			st = sts[0]
		}
		return len(sts) == 1
	})
	took := time.Since(begun)
	t.Logf("the agent answered %s after it started (two ungranted platforms)", took.Round(time.Millisecond))
	if took > 4*time.Second {
		t.Errorf("the agent took %s to start: an ungranted platform delayed it", took)
	}
	if !slices.Equal(st.Platforms, []string{"linux/amd64"}) || !slices.Equal(st.Builds, cfg.Platforms) {
		t.Errorf("status platforms %v builds %v: want the queue it holds, [linux/amd64], apart from every platform %v", st.Platforms, st.Builds, cfg.Platforms)
	}
	a1 := ask("a1")
	data, _ := json.Marshal(a1)
	if _, err := cjs.Publish(ctx, mesh.BuildSubject(mesh.DefaultPlatform), data, jetstream.WithMsgID(a1.ID)); err != nil {
		t.Fatal(err)
	}
	if id := recv(t, g.began, 10*time.Second); id != "a1" {
		t.Fatalf("began %s, want a1", id)
	}
	g.ch("a1") <- nil
}
