package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// issueAgentM1 writes the credentials keys issue for agent m1 from cat,
// and returns the file.
func issueAgentM1(t *testing.T, keys *creds.Keys, cat *mesh.Catalogue) string {
	t.Helper()
	return issueFor(t, keys, cat, mesh.KindAgent, "m1")
}

// issueFor writes the credentials keys issue for the principal of kind
// kind called name from cat, and returns the file.
func issueFor(t *testing.T, keys *creds.Keys, cat *mesh.Catalogue, kind, name string) string {
	t.Helper()
	p, err := cat.PrincipalPermissions(kind, name)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), kind+".creds")
	if err := keys.IssueFile(p, "", file); err != nil {
		t.Fatal(err)
	}
	return file
}

// Credentials issued from a catalogue grant its platforms' queues only:
// grantedPlatforms keeps those, and refuses, naming the file and what to
// do, when none of the machine's is granted.
func TestAnAgentTakesOnlyThePlatformsItsCredentialsGrant(t *testing.T) {
	keys, err := creds.Init(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	amd := issueAgentM1(t, keys, meshtest.Catalogue(t, nil))
	ms := append(meshtest.MeshManifests(t), &mesh.Manifest{Module: "tool", Build: &mesh.Build{Repo: "r", Platforms: []string{"linux/arm64", "linux/amd64"}}})
	both := issueAgentM1(t, keys, mesh.NewCatalogue(ms))
	machine := []string{"linux/amd64", "linux/amd64/v2", "linux/386", "linux/arm64"}
	log := slog.New(slog.DiscardHandler)
	if got, err := grantedPlatforms(amd, machine, log); err != nil || !slices.Equal(got, []string{"linux/amd64"}) {
		t.Errorf("amd64 credentials: %v, %v; want [linux/amd64]", got, err)
	}
	if got, err := grantedPlatforms(both, machine, log); err != nil || !slices.Equal(got, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("amd64+arm64 credentials: %v, %v; want both", got, err)
	}
	_, err = grantedPlatforms(amd, []string{"linux/arm64"}, log)
	if err == nil || !strings.Contains(err.Error(), amd) || !strings.Contains(err.Error(), "builds creds issue") {
		t.Errorf("no platform granted: %v, want an error naming the file and what to do", err)
	}
}

// A build agent with its issued credentials on a server that enforces
// them, on a machine whose buildkitd builds more platforms (amd64's
// variants, 386) than the catalogue its credentials were issued from:
// it binds the granted queue only and holds the seat — no permission
// violation, no bind timing out on a queue it may not read.
func TestAnAgentBindsOnlyTheQueuesItsCredentialsGrant(t *testing.T) {
	bk := testenv.Buildkitd(t)
	keys, err := creds.Init(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts, err := keys.ServerOptions()
	if err != nil {
		t.Fatal(err)
	}
	s := natstest.Server(t, opts)
	cat := meshtest.Catalogue(t, nil)
	file := func(kind string) string {
		name := ""
		if kind == mesh.KindAgent {
			name = "m1"
		}
		p, err := cat.PrincipalPermissions(kind, name)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), kind+".creds")
		if err := keys.IssueFile(p, "", f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	ctl := file(mesh.KindController)
	_, js := natstest.Connect(t, s, nats.UserCredentials(ctl), nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.ControllerPrincipal)))
	if _, err := mesh.Raise(context.Background(), js, cat, 1); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := startAgent(t, ctx, "m1", AgentOptions{NATS: s.ClientURL(), Creds: file(mesh.KindAgent), BuildKit: bk,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	awaitLog(t, "the agent to hold the build seat", &logs, done, "holding the build seat")
	held := testenv.GrepLines(logs.String(), "holding the build seat")
	if !strings.Contains(held, mesh.BuildConsumer(mesh.DefaultPlatform)) || strings.Contains(held, "386") || strings.Contains(held, "v2") {
		t.Fatalf("the agent binds %s, want only %s", held, mesh.BuildConsumer(mesh.DefaultPlatform))
	}
	c, err := js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the agent to pull", func() bool {
		info, err := c.Info(ctx)
		return err == nil && info.NumWaiting > 0
	})
	// What `builds machines` shows of it (the operator asks the seat's
	// status tool): the platform it takes, the granted one, and no other
	// of its worker's.
	onc, _ := natstest.Connect(t, s, nats.UserCredentials(file(mesh.KindOperator)), nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.OperatorPrincipal)))
	sts, err := agent.AskStatus(ctx, onc, time.Second)
	if err != nil || len(sts) != 1 {
		t.Fatalf("status: %+v, %v: want m1's", sts, err)
	}
	if st := sts[0]; !slices.Equal(st.Platforms, []string{mesh.DefaultPlatform}) || !slices.Equal(st.Builds, []string{mesh.DefaultPlatform}) {
		t.Errorf("m1's status: platforms %v, builds %v: want the granted platform, %s, alone", st.Platforms, st.Builds, mesh.DefaultPlatform)
	}
	if l := logs.String(); strings.Contains(strings.ToLower(l), "permissions violation") || strings.Contains(l, "timeout") {
		t.Errorf("the agent met refusals or timeouts:\n%s", l)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunAgent: %v", err)
	}
}

// Credentials issued from this version's catalogue let a machine announce
// its hand-backs; those issued from a catalogue older than the event do
// not, and the agent is told to announce none (rather than wait out a
// refused publish at every retry).
func TestHandBacksAreAnnouncedOnlyWhereTheCredentialsGrantThem(t *testing.T) {
	keys, err := creds.Init(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if !handBacksGranted(issueAgentM1(t, keys, mesh.NewCatalogue(meshtest.MeshManifests(t))), "m1", log) {
		t.Error("credentials of this version's catalogue: hand-backs not granted")
	}
	old := meshtest.MeshManifests(t)
	for _, m := range old {
		for i := range m.Seats {
			m.Seats[i].Emits = slices.DeleteFunc(m.Seats[i].Emits, func(e string) bool { return e == mesh.EventHandedBack })
		}
	}
	if handBacksGranted(issueAgentM1(t, keys, mesh.NewCatalogue(old)), "m1", log) {
		t.Error("credentials of a catalogue without handed-back: hand-backs granted")
	}
}

// A build agent given a node's credentials (mesh-node's --creds, not its
// --agent-creds) is refused at once, naming the file and the credentials
// it takes; before, it said only that they granted none of its platforms.
// Its own machine's are taken, under their machine's name.
func TestAnAgentGivenANodesCredentialsIsToldWhichItTakes(t *testing.T) {
	keys, err := creds.Init(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cat := meshtest.Catalogue(t, nil)
	node := issueFor(t, keys, cat, mesh.KindNode, "m1")
	_, err = AgentMachine(node, "m1", false)
	if err == nil || !strings.Contains(err.Error(), node) || !strings.Contains(err.Error(), "--principal agent m1") {
		t.Errorf("AgentMachine with a node's credentials: %v; want it refused, naming the file and the agent credentials to issue", err)
	}
	if m, err := AgentMachine(issueAgentM1(t, keys, cat), "vm", false); err != nil || m != "m1" {
		t.Errorf("AgentMachine with agent m1's credentials = %q, %v; want m1", m, err)
	}
}
