package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/state"
)

// keepBus is a real server enforcing the derived sets: the build agent's
// own connection, node m1 with the credentials `builds up` and `builds
// creds` issue a build machine (PrincipalPermissions, node), node m2 with a
// node's own set only (no bucket granted), the controller and an operator.
type keepBus struct {
	s       *server.Server
	cat     *mesh.Catalogue
	admin   jetstream.JetStream
	refused chan error
}

func newKeepBus(t *testing.T) *keepBus {
	t.Helper()
	cat := meshtest.Catalogue(t, nil)
	agentMod, _ := cat.Module(mesh.AgentModule)
	node, err := cat.PrincipalPermissions(mesh.KindNode, "m1")
	if err != nil {
		t.Fatal(err)
	}
	users := []*server.User{{Username: "admin", Password: "pw"}}
	m1, _ := cat.MachinePermissions("m1")
	m2, _ := cat.MachinePermissions("m2")
	_ = agentMod
	for _, p := range []mesh.Permissions{
		m1, m2, node, mesh.NodePermissions("m2"),
		cat.ControllerPermissions(mesh.ControllerPrincipal), cat.OperatorPermissions(mesh.OperatorPrincipal),
	} {
		users = append(users, &server.User{Username: p.Principal, Password: "pw", Permissions: p.ServerPermissions()})
	}
	b := &keepBus{s: natstest.Server(t, &server.Options{Users: users}), cat: cat, refused: make(chan error, 16)}
	_, b.admin = natstest.Connect(t, b.s, nats.UserInfo("admin", "pw"))
	if _, err := mesh.Raise(context.Background(), b.admin, cat, 1); err != nil {
		t.Fatal(err)
	}
	return b
}

// js connects as user (a node's name is node NAME's principal); the
// server's refusals go to b.refused.
func (b *keepBus) js(t *testing.T, user string) jetstream.JetStream {
	if user == "m1" || user == "m2" {
		user = mesh.PrincipalID(mesh.KindNode, user)
	}
	_, js := natstest.Connect(t, b.s, nats.UserInfo(user, "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix(user)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case b.refused <- err:
			default:
			}
		}))
	return js
}

// surface is module's state surface on user's connection, issued what the
// catalogue derives for module.
func (b *keepBus) surface(t *testing.T, user, module string) *state.Store {
	m, ok := b.cat.Module(module)
	if !ok {
		t.Fatalf("no module %s", module)
	}
	return state.New(b.js(t, user), module, b.cat.IssuedBuckets(m))
}

// start runs an agent of machine on its own (build-agent) connection,
// keeping its records in st.
func (b *keepBus) start(t *testing.T, machine string, w agent.Worker, st agent.StateWriter) ends {
	cfg := agent.DefaultConfig()
	cfg.Machine, cfg.State = machine, st
	cfg.FetchWait = 500 * time.Millisecond
	obs := make(ends, 16)
	a, err := agent.New(cfg, b.js(t, mesh.PrincipalID(mesh.KindAgent, machine)), w, nil, obs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return obs
}

func (b *keepBus) noRefusals(t *testing.T) {
	t.Helper()
	select {
	case err := <-b.refused:
		t.Fatalf("the server refused a principal: %v", err)
	default:
	}
}

func readRecord(t *testing.T, st state.Surface, bucket, key string) mesh.BuildRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := st.Get(ctx, bucket, key)
	if err != nil {
		t.Fatalf("reading %s %s: %v", bucket, key, err)
	}
	var r mesh.BuildRecord
	if err := json.Unmarshal(e.Value, &r); err != nil {
		t.Fatalf("%s %s: %q: %v", bucket, key, e.Value, err)
	}
	return r
}

// The farm uses module state (ADR 0201): an agent keeps each build's record
// — when, how long, the outcome and the digest — through the state surface
// its node was issued, under the node's `builds up` credentials on a server
// that enforces them; the controller (through its own surface: reads
// build-agent.builds) and an operator read it; the next build of the module
// on the machine replaces it, a failure included.
func TestAnAgentKeepsItsLastBuildOfEachModule(t *testing.T) {
	b := newKeepBus(t)
	g := newGate()
	obs := b.start(t, "m1", g.on("m1"), b.surface(t, "m1", mesh.AgentModule))
	key := mesh.BuildRecordKey("tool", "m1")
	controller := b.surface(t, mesh.ControllerPrincipal, "build-controller")
	operator := state.New(b.js(t, mesh.OperatorPrincipal), mesh.OperatorPrincipal, b.cat.OperatorBuckets())

	before := time.Now().UTC()
	a1 := ask("a1")
	a1.Platform = mesh.DefaultPlatform
	submit(t, b.admin, a1)
	recv(t, g.began, 10*time.Second)
	g.ch("a1") <- nil
	end := obs.next(t, agent.OutcomeBuilt, 20*time.Second)

	r := readRecord(t, controller, mesh.AgentBuildsRef(), key)
	want := "sha256:" + fmt.Sprintf("%064x", len("a1"))
	if r.Module != "tool" || r.Machine != "m1" || r.Outcome != mesh.EventBuilt || r.Digest != want ||
		r.Duration != end.Took || r.At.Before(before) || r.Ask != "a1" || r.Plan != "p1" || r.Platform != mesh.DefaultPlatform || r.Version != mesh.BuildRecordVersion {
		t.Errorf("the controller reads %+v; want tool built on m1 in %s, digest %s, after %s", r, end.Took, want, before)
	}
	if o := readRecord(t, operator, mesh.AgentBuildsRef(), key); o != r {
		t.Errorf("the operator reads %+v, the controller %+v", o, r)
	}

	// The next build of the module replaces it: one record per module
	// per machine.
	submit(t, b.admin, ask("a2"))
	recv(t, g.began, 10*time.Second)
	g.ch("a2") <- fmt.Errorf("%w: exit code: 1", agent.ErrBuild)
	obs.next(t, agent.OutcomeFailed, 20*time.Second)
	r = readRecord(t, controller, mesh.AgentBuildsRef(), key)
	if r.Outcome != mesh.EventFailed || r.Reason != mesh.ReasonBuild || r.Digest != "" || r.Ask != "a2" {
		t.Errorf("after a failed build the record is %+v; want the failure", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if keys, err := controller.Keys(ctx, mesh.AgentBuildsRef()); err != nil || len(keys) != 1 || keys[0] != key {
		t.Errorf("keys %v, %v; want one, %s", keys, err, key)
	}
	b.noRefusals(t)
}

// A node without the grant is refused: the runtime refuses a write to a
// bucket the module was not issued, at once and with the reason, and the
// server refuses the node's own write to the bucket; the agent builds and
// announces all the same, without a record.
func TestANodeWithoutTheGrantKeepsNoRecord(t *testing.T) {
	b := newKeepBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	notIssued := state.New(b.js(t, "m2"), mesh.AgentModule, nil)
	start := time.Now()
	if _, err := notIssued.Put(ctx, mesh.AgentBuildsBucket, "tool.m2", []byte(`{}`)); !errors.Is(err, state.ErrNotIssued) || time.Since(start) > time.Second {
		t.Fatalf("a write to a bucket not issued: %v after %s; want the runtime's ErrNotIssued at once", err, time.Since(start))
	}

	// The bucket issued, but the node's credentials grant it nothing: the
	// server refuses the write.
	g := newGate()
	obs := b.start(t, "m2", g.on("m2"), b.surface(t, "m2", mesh.AgentModule))
	submit(t, b.admin, ask("a1"))
	recv(t, g.began, 10*time.Second)
	g.ch("a1") <- nil
	obs.next(t, agent.OutcomeBuilt, 30*time.Second)
	select {
	case err := <-b.refused:
		if !strings.Contains(err.Error(), mesh.KVBucket(mesh.AgentModule, mesh.AgentBuildsBucket)) {
			t.Fatalf("the server refused %v; want the write to the agent's bucket", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not refuse node m2 a write to the agent's bucket")
	}
	kv, err := b.admin.KeyValue(ctx, mesh.KVBucket(mesh.AgentModule, mesh.AgentBuildsBucket))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, mesh.BuildRecordKey("tool", "m2")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("a record written without a grant: %v", err)
	}
}
