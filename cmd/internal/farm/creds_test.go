package farm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/demo"
	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/cmd/internal/farm/farmtest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	mstate "github.com/meshbuild/meshbuild/state"
)

// `builds up` runs NATS with authorization on and every component under
// its own credentials: a build agent's cannot publish a plan's module as
// built in the controller's place, read another node's declarations, or
// subscribe to the queue it only pulls from — each refused by the server —
// while what its set allows works. No credentials, no connection; the
// operator's are in the state directory, named in the banner.
func TestUpEnforcesEachComponentsCredentials(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, _ := testenv.SmallFleet(t, "base")
	state := t.TempDir()
	var banner bytes.Buffer
	f, logs, stop := farmtest.Up(t, farm.UpOptions{
		Catalogue: catalogue, Agents: 2, StateDir: state,
		InsteadOf: demo.InsteadOf(state), Out: &banner,
	})
	defer stop()
	if want := "MESHBUILD_CREDS=" + f.OperatorCreds(); !strings.Contains(banner.String(), want) {
		t.Errorf("the banner lacks %s:\n%s", want, banner.String())
	}
	if got := farm.OperatorCredsIn(state); got != f.OperatorCreds() {
		t.Errorf("OperatorCredsIn(%s) = %s, want %s", state, got, f.OperatorCreds())
	}
	machines := f.Machines()
	for _, p := range []string{f.OperatorCreds(), f.ControllerCreds(), f.NodeCreds(machines[0]), f.AgentCreds(machines[1])} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want a file only its owner reads", p, fi, err)
		}
	}

	// Without credentials the server admits nobody.
	if nc, err := nats.Connect(f.NATSURL()); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("connecting without credentials: %v, want an authorization violation", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	refused := make(chan error, 8)
	nc, err := nats.Connect(f.NATSURL(), nats.UserCredentials(f.AgentCreds(machines[0])),
		nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.PrincipalID(mesh.KindAgent, machines[0]))), nats.PermissionErrOnSubscribe(true),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refused <- err }))
	if err != nil {
		t.Fatalf("the agent's credentials: %v", err)
	}
	defer nc.Close()
	wantRefused := func(what string) {
		t.Helper()
		select {
		case err := <-refused:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("%s: %v, want a permissions violation", what, err)
			}
		case <-ctx.Done():
			t.Fatalf("%s was not refused", what)
		}
	}

	// What the agent's set allows works: it binds the seat's consumer.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform)); err != nil {
		t.Fatalf("the agent binding its seat's consumer: %v", err)
	}

	// The controller's record that a plan's module is built.
	plan := "p-forged"
	built, _ := json.Marshal(cascade.ModuleStatus{Module: "base", State: cascade.Built, Digest: "sha256:" + strings.Repeat("0", 64)})
	nc.Publish("$KV."+mesh.KVBucket("build-controller", cascade.StateBucket)+"."+cascade.ModuleKey(plan, "base"), built)
	wantRefused("the agent writing a plan's module as built in the controller's bucket")

	// Speaking for another machine (issue 19): its outcome subject.
	nc.Publish(mesh.HolderEventSubject(mesh.BuildSeat, machines[1], mesh.EventBuilt), []byte(`{}`))
	wantRefused("the agent of one machine announcing built for another")

	// Another node's declarations: its subject and its consumer.
	sub, err := nc.SubscribeSync(mesh.NodeSubject(machines[1]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(time.Minute); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Errorf("the agent subscribing to %s's declarations: %v, want a permissions violation", machines[1], err)
	}
	wantRefused("the agent subscribing to another node's declarations")
	nc.Publish("$JS.API.CONSUMER.MSG.NEXT."+mesh.NodesStream+"."+mesh.NodeConsumer(machines[1]), nil)
	wantRefused("the agent fetching from another node's consumer")

	// The queue it pulls from, subscribed to directly.
	queue, err := nc.SubscribeSync(mesh.SeatAcceptAll(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.NextMsg(time.Minute); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Errorf("the agent subscribing to the build queue: %v, want a permissions violation", err)
	}
	wantRefused("the agent subscribing to the build queue")

	// A build machine's node writes the build agent's records — the
	// surface it serves the agent it carries — and no other bucket: the
	// runtime refuses a bucket not issued at once, the server the node's
	// own write to one.
	nrefused := make(chan error, 8)
	nnc, err := nats.Connect(f.NATSURL(), nats.UserCredentials(f.NodeCreds(machines[0])),
		nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.PrincipalID(mesh.KindNode, machines[0]))),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { nrefused <- err }))
	if err != nil {
		t.Fatalf("the node's credentials: %v", err)
	}
	defer nnc.Close()
	njs, err := jetstream.New(nnc)
	if err != nil {
		t.Fatal(err)
	}
	cat, _, err := mesh.Load(catalogue)
	if err != nil {
		t.Fatal(err)
	}
	agentMod, _ := cat.Module(mesh.AgentModule)
	surface := mstate.New(njs, mesh.AgentModule, cat.IssuedBuckets(agentMod))
	if _, err := surface.Put(ctx, mesh.AgentBuildsBucket, mesh.BuildRecordKey("base", machines[0]), []byte(`{"module":"base"}`)); err != nil {
		t.Errorf("the node writing the agent's record: %v", err)
	}
	if _, err := surface.Put(ctx, "plans", cascade.ModuleKey(plan, "base"), built); !errors.Is(err, mstate.ErrNotIssued) {
		t.Errorf("the agent writing the controller's plans through its node: %v, want the runtime's ErrNotIssued", err)
	}
	nnc.Publish("$KV."+mesh.KVBucket("build-controller", cascade.StateBucket)+"."+cascade.ModuleKey(plan, "base"), built)
	select {
	case err := <-nrefused:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("the node writing the controller's plans: %v, want a permissions violation", err)
		}
	case <-ctx.Done():
		t.Fatal("the node writing the controller's plans was not refused")
	}

	// The server's log says so too: what TestUpDemo reads to find that no
	// component was refused anything.
	testenv.WaitFor(t, 10*time.Second, "the refusals in the farm's log", func() bool {
		return strings.Contains(testenv.GrepLines(logs.String(), "Subscription Violation"), mesh.SeatAcceptAll(mesh.BuildSeat))
	})
}
