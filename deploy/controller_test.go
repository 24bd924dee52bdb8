package deploy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// TestEnrolmentIsAnsweredAtThePayloadAddress: a node, under its derived
// permissions, enrols and hears the answer at the address its payload names
// (a work-queue message keeps no reply subject); enrolling again is
// idempotent; the same name from another machine is refused naming the
// holder.
func TestEnrolmentIsAnsweredAtThePayloadAddress(t *testing.T) {
	b := newBed(t, []string{"n1"})
	b.controller(deploy.DefaultControllerConfig())
	n, _ := b.node("n1", t.TempDir(), nil)
	if err := n.Enrol(b.ctx); err != nil {
		t.Fatalf("enrolling: %v", err)
	}
	if _, err := b.ajs.Consumer(b.ctx, mesh.NodesStream, mesh.NodeConsumer("n1")); err != nil {
		t.Fatalf("the node's consumer was not created at enrolment: %v", err)
	}
	if err := n.Enrol(b.ctx); err != nil {
		t.Fatalf("enrolling again: %v", err)
	}
	if v := b.nodes()["n1"]; v.Identity != n.Identity() || len(v.Platforms) != 1 {
		t.Fatalf("node record %+v", v)
	}
	other, _ := b.node("n1", t.TempDir(), nil)
	err := other.Enrol(b.ctx)
	if !errors.Is(err, deploy.ErrRefused) || !strings.Contains(err.Error(), n.Identity()) {
		t.Fatalf("a second machine enrolling n1: %v, want refused naming %s", err, n.Identity())
	}
	// The answer goes out before the enrolment is acked: wait for the ack.
	testenv.WaitFor(t, 10*time.Second, "every enrolment to leave the queue", func() bool { return b.seatMsgs() == 0 })
	b.noViolations()
}

// TestAnEnrolmentAnsweringElsewhereIsRefused: the reply address must be the
// node's own, or the controller would publish wherever a payload points.
func TestAnEnrolmentAnsweringElsewhereIsRefused(t *testing.T) {
	b := newBed(t, []string{"n1", "n2"})
	b.controller(deploy.DefaultControllerConfig())
	elsewhere, err := b.anc.SubscribeSync(mesh.NodeAnswerAll("n2"))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(deploy.Enrol{Version: 1, Node: "n1", Identity: "x", Reply: mesh.NodeAnswerSubject("n2", "a")})
	if _, err := b.ajs.Publish(b.ctx, mesh.SeatAcceptSubject(mesh.ControllerSeat, mesh.EnrolVerb), data); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the enrolment to be settled", func() bool { return b.seatMsgs() == 0 })
	if m, err := elsewhere.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("the controller answered at another node's address: %s", m.Data)
	}
	if _, ok := b.nodes()["n1"]; ok {
		t.Fatal("a refused enrolment was recorded")
	}
}

// TestAnEnrolmentUnderAReservedNameIsRefused: a node may not enrol as
// another principal or the mesh's own (issue 19): refused, unrecorded, no
// consumer made for it.
func TestAnEnrolmentUnderAReservedNameIsRefused(t *testing.T) {
	b := newBed(t, []string{"n1"})
	b.controller(deploy.DefaultControllerConfig())
	for _, name := range []string{mesh.OperatorPrincipal, mesh.ControllerPrincipal, mesh.AgentModule, "mesh-git"} {
		data, _ := json.Marshal(deploy.Enrol{Version: 1, Node: name, Identity: "x", Reply: mesh.NodeAnswerSubject(name, "a")})
		if _, err := b.ajs.Publish(b.ctx, mesh.SeatAcceptSubject(mesh.ControllerSeat, mesh.EnrolVerb), data); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the enrolments to be settled", func() bool { return b.seatMsgs() == 0 })
	nodes := b.nodes()
	for _, name := range []string{mesh.OperatorPrincipal, mesh.ControllerPrincipal, mesh.AgentModule, "mesh-git"} {
		if _, ok := nodes[name]; ok {
			t.Errorf("node %q enrolled", name)
		}
		if _, err := b.ajs.Consumer(b.ctx, mesh.NodesStream, mesh.NodeConsumer(name)); err == nil {
			t.Errorf("a consumer was made for node %q", name)
		}
	}
}

// pushImage pushes a random image to host/repo and returns its digest.
func pushImage(t *testing.T, host, repo string) string {
	t.Helper()
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host+"/"+repo+":latest", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	return d.String()
}

// TestAssignmentDeclaresAffectedNodesOnly: assigning a module composes the
// declaration of the nodes it goes to and no other; a new current digest
// reaches exactly the nodes that run the module; refusals name the fix.
func TestAssignmentDeclaresAffectedNodesOnly(t *testing.T) {
	b := newBed(t, []string{"n1", "n2"})
	b.controller(deploy.DefaultControllerConfig())
	for _, name := range []string{"n1", "n2"} {
		n, _ := b.node(name, t.TempDir(), nil)
		if err := n.Enrol(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	b.setCurrent("app", "reg.example/app", "sha256:"+strings.Repeat("a", 64))

	if _, err := b.call(mesh.AssignTool, deploy.Request{Module: "nope", Nodes: []string{"n1"}}); !errors.Is(err, deploy.ErrUnknownModule) {
		t.Fatalf("unknown module: %v", err)
	}
	if _, err := b.call(mesh.AssignTool, deploy.Request{Module: "app", Nodes: []string{"n9"}}); !errors.Is(err, deploy.ErrUnknownNode) || !strings.Contains(err.Error(), "mesh-node --name n9") ||
		strings.Count(err.Error(), "unknown node") != 1 || errors.Is(err, deploy.ErrUnknownModule) {
		t.Fatalf("unknown node (its sentinel only, said once): %v", err)
	}
	if _, err := b.call(mesh.AssignTool, deploy.Request{Module: "build-controller", Nodes: []string{"n1", "n2"}}); !errors.Is(err, deploy.ErrOneNodeOnly) {
		t.Fatalf("a mesh-scoped seat's holder on two nodes: %v", err)
	}
	if _, err := b.call(mesh.AssignTool, deploy.Request{Module: "build-controller", Nodes: []string{"n1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.call(mesh.AssignTool, deploy.Request{Module: "build-controller", Nodes: []string{"n2"}}); !errors.Is(err, deploy.ErrOneNodeOnly) || !strings.Contains(err.Error(), "builds unassign build-controller n1") {
		t.Fatalf("a mesh-scoped seat's holder moved without unassigning: %v", err)
	}
	r, err := b.call(mesh.AssignTool, deploy.Request{Module: "app", Nodes: []string{"n1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Declared) != 1 || r.Declared[0].Node != "n1" {
		t.Fatalf("declared %+v, want n1 only", r.Declared)
	}
	d, ok := b.lastDeclaration("n1")
	if !ok || d.Revision != 2 || len(d.Modules) != 2 {
		t.Fatalf("n1's declaration %+v", d)
	}
	app := d.Modules[0]
	if app.Module != "app" || app.Ref() != "reg.example/app@sha256:"+strings.Repeat("a", 64) {
		t.Fatalf("app declared as %+v", app)
	}
	if ctl := d.Modules[1]; len(ctl.Seats) != 1 || ctl.Seats[0] != (deploy.Seat{Seat: mesh.ControllerSeat, Scope: mesh.ScopeMesh}) {
		t.Fatalf("build-controller's seats %+v", ctl.Seats)
	}
	if _, ok := b.lastDeclaration("n2"); ok {
		t.Fatal("n2 was declared to although nothing is assigned to it")
	}

	// A plan settles with a new digest for app: n1 only.
	b.setCurrent("app", "reg.example/app", "sha256:"+strings.Repeat("b", 64))
	testenv.WaitFor(t, 10*time.Second, "n1's declaration to carry the new digest", func() bool {
		d, _ := b.lastDeclaration("n1")
		return d.Revision == 3 && d.Modules[0].Digest == "sha256:"+strings.Repeat("b", 64)
	})
	// A module n1 does not run changes: n1 gets nothing.
	b.setCurrent("base", "reg.example/base", "sha256:"+strings.Repeat("c", 64))
	if _, err := b.call(mesh.UnassignTool, deploy.Request{Module: "build-controller", Nodes: []string{"n1"}}); err != nil {
		t.Fatal(err)
	}
	d, _ = b.lastDeclaration("n1")
	if d.Revision != 4 || len(d.Modules) != 1 {
		t.Fatalf("after unassigning build-controller n1 has %+v, want revision 4 with app only (base's change declared nothing)", d)
	}
	if _, ok := b.lastDeclaration("n2"); ok {
		t.Fatal("n2 was declared to")
	}
	b.noViolations()
}

// TestRestartedControllerReassertsNodeConsumers: a mesh restored from a
// backup has node records and no consumers; the controller creates them on
// start.
func TestRestartedControllerReassertsNodeConsumers(t *testing.T) {
	b := newBed(t, []string{"n1"})
	_, c := b.controller(deploy.DefaultControllerConfig())
	n, _ := b.node("n1", t.TempDir(), nil)
	if err := n.Enrol(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	if err := b.ajs.DeleteConsumer(b.ctx, mesh.NodesStream, mesh.NodeConsumer("n1")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ajs.Consumer(b.ctx, mesh.NodesStream, "n1"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("consumer still there: %v", err)
	}
	b.controller(deploy.DefaultControllerConfig())
	cons, err := b.ajs.Consumer(b.ctx, mesh.NodesStream, mesh.NodeConsumer("n1"))
	if err != nil {
		t.Fatalf("the restarted controller did not re-assert n1's consumer: %v", err)
	}
	cfg := cons.CachedInfo().Config
	if cfg.FilterSubject != mesh.NodeSubject("n1") || cfg.AckWait != 5*time.Minute || cfg.MaxDeliver != -1 {
		t.Fatalf("re-asserted consumer %+v", cfg)
	}
}

// TestNodeAppliesByDigestIntoALayout: an assigned module's image is pulled
// by digest into the node's OCI layout and verified, the apply hook is run
// with the module, image, digest and revision, and the node reports
// applied; the controller records it.
func TestNodeAppliesByDigestIntoALayout(t *testing.T) {
	reg := registrytest.Registry(t)
	b := newBed(t, []string{"n1"})
	b.controller(deploy.DefaultControllerConfig())
	dir := t.TempDir()
	hookOut := filepath.Join(t.TempDir(), "hook.log")
	hook := filepath.Join(t.TempDir(), "hook.sh")
	script := "#!/bin/sh\necho \"$MESHBUILD_ACTION $MESHBUILD_MODULE $MESHBUILD_IMAGE $MESHBUILD_DIGEST $MESHBUILD_REVISION\" >> " + hookOut + "\n"
	if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	digest, rev := b.applyWithHook(reg, dir, hook)
	out, _ := os.ReadFile(hookOut)
	if want := fmt.Sprintf("apply app %s/app@%s %s %d\n", reg, digest, digest, rev); string(out) != want {
		t.Fatalf("hook saw %q, want %q", out, want)
	}
	idx, err := os.ReadFile(filepath.Join(dir, "images", "index.json"))
	if err != nil || !strings.Contains(string(idx), digest) {
		t.Fatalf("the layout's index does not hold %s: %s %v", digest, idx, err)
	}
	b.noViolations()
}

// A hook that starts a process and leaves it running (`app &`, its output
// the hook's) is done when it exits: the node reports the revision
// applied. Before, the node waited on the hook's output for as long as the
// process it left ran.
func TestAHookThatLeavesAProcessRunningIsDoneWhenItExits(t *testing.T) {
	reg := registrytest.Registry(t)
	b := newBed(t, []string{"n1"})
	b.controller(deploy.DefaultControllerConfig())
	hook := filepath.Join(t.TempDir(), "hook.sh")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\necho starting $MESHBUILD_MODULE\nsleep 60 &\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b.applyWithHook(reg, t.TempDir(), hook)
}

// applyWithHook starts node n1 with state dir and apply hook, pushes an
// image of module app to reg and assigns app to n1, and waits for n1 to
// report it applied: the image's digest and the declaration's revision.
func (b *bed) applyWithHook(reg, dir, hook string) (digest string, rev uint64) {
	t := b.t
	t.Helper()
	_, js := b.connect("n1", nil)
	cfg := deploy.DefaultNodeConfig()
	cfg.Name, cfg.StateDir, cfg.Registry, cfg.ApplyHook = "n1", dir, registry.NewClient(registry.WithInsecure(true)), hook
	// A hook written just now may be busy for an exec forked meanwhile
	// (ETXTBSY): a failed apply is retried soon.
	cfg.RetryDelay = 200 * time.Millisecond
	n, err := deploy.NewNode(cfg, js, testLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	run(b.ctx, n.Run)
	testenv.WaitFor(t, 10*time.Second, "n1 to enrol", func() bool { _, ok := b.nodes()["n1"]; return ok })

	digest = pushImage(t, reg, "app")
	b.setCurrent("app", reg+"/app", digest)
	if _, err := b.call(mesh.AssignTool, deploy.Request{Module: "app", Nodes: []string{"n1"}}); err != nil {
		t.Fatal(err)
	}
	// The assignment and the current image may make one declaration or
	// two (the first without the image, nothing to pull).
	rev = b.declaredWith("n1", "app", digest).Revision
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("n1 to report revision %d applied", rev), func() bool {
		v := b.nodes()["n1"]
		return v.Applied == rev && v.Outcome == deploy.Applied && len(v.Modules) == 1 && v.Modules[0].Applied == digest
	})
	return digest, rev
}

// A fleet controller whose seat claim says it is no longer held
// (claim.Lease.Held, by its own clock) writes no assignment and publishes
// no declaration: the operator's call is refused saying so, and the node's
// last declaration is the one made while it held the seat.
func TestAFleetControllerThatNoLongerHoldsItsSeatDeclaresNothing(t *testing.T) {
	b := newBed(t, []string{"n1"})
	var lost atomic.Bool
	b.controllerWith(deploy.DefaultControllerConfig(), func(c *deploy.Controller) {
		c.SetHeld(func() error {
			if lost.Load() {
				return fmt.Errorf("%w: no renewal within the lease (by this process's clock)", claim.ErrLost)
			}
			return nil
		})
	})
	n, _ := b.node("n1", t.TempDir(), nil)
	if err := n.Enrol(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.setCurrent("app", "reg.example/app", "sha256:"+strings.Repeat("a", 64))
	if _, err := b.call(mesh.AssignTool, deploy.Request{Module: "app", Nodes: []string{"n1"}}); err != nil {
		t.Fatal(err)
	}
	// The assignment and the current image make one declaration or two, as
	// the controller hears them: wait for the one that carries the digest.
	before := b.declaredWith("n1", "app", "sha256:"+strings.Repeat("a", 64))
	lost.Store(true)
	_, err := b.call(mesh.UnassignTool, deploy.Request{Module: "app", Nodes: []string{"n1"}})
	if err == nil || !strings.Contains(err.Error(), "lease") {
		t.Fatalf("unassign once the seat is lost: %v, want refused naming the lease", err)
	}
	// A plan settling with a new digest for app declares nothing either.
	b.setCurrent("app", "reg.example/app", "sha256:"+strings.Repeat("b", 64))
	time.Sleep(time.Second)
	after, _ := b.lastDeclaration("n1")
	if after.Revision != before.Revision || after.Modules[0].Digest != before.Modules[0].Digest {
		t.Fatalf("n1 declared to after the seat was lost: revision %d → %d, %s", before.Revision, after.Revision, after.Modules[0].Digest)
	}
}
