package daemon

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/claim"
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

// enforcingServer is a server that enforces the credentials keys issue.
func enforcingServer(t *testing.T) (*creds.Keys, *server.Server) {
	t.Helper()
	keys, err := creds.Init(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts, err := keys.ServerOptions()
	if err != nil {
		t.Fatal(err)
	}
	return keys, natstest.Server(t, opts)
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
	keys, s := enforcingServer(t)
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

// The hand-back of a killed predecessor's ask works under the machine's own
// credentials, on a server that enforces them. The predecessor, with m1's
// credentials, holds m1's seat (a pid that no longer runs), fetches an ask
// and claims it as the agent does, then its connection goes without a word
// (kill -9). m1's agent, started at once, takes the seat over and hands the
// ask back: the server delivers it again well inside the holders' ack wait
// (8 s), and nothing it did was refused.
func TestARestartedAgentHandsBackItsPredecessorsAskUnderItsCredentials(t *testing.T) {
	bk := testenv.Buildkitd(t)
	keys, s := enforcingServer(t)
	cat := meshtest.Catalogue(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, cjs := natstest.Connect(t, s, nats.UserCredentials(issueFor(t, keys, cat, mesh.KindController, "")),
		nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.ControllerPrincipal)))
	if _, err := mesh.Raise(ctx, cjs, cat, 1); err != nil {
		t.Fatal(err)
	}
	m1 := issueAgentM1(t, keys, cat)
	pnc, pjs := natstest.Connect(t, s, nats.UserCredentials(m1), nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.PrincipalID(mesh.KindAgent, "m1"))))
	host, _ := os.Hostname()
	holder := "build-agent on " + host + " pid " + strconv.Itoa(deadPid(t))
	seat := leaveClaim(t, pjs, "m1", holder, time.Minute)

	// Two asks: the predecessor dies building the first, and between
	// recording the second's outcome in its claim and announcing it.
	a := mesh.Ask{Version: mesh.AskVersion, ID: "p1-tool-1", Plan: "p1", Module: "tool", Secret: "s3cret",
		Source: mesh.Source{Repo: "https://git.example/x.git", Commit: "abc"}, Image: "127.0.0.1:1/tool"}
	a2 := a
	a2.ID, a2.Plan = "p2-tool-1", "p2"
	for _, ask := range []mesh.Ask{a, a2} {
		data, _ := json.Marshal(ask)
		if _, err := cjs.Publish(ctx, mesh.BuildSubject(mesh.DefaultPlatform), data, jetstream.WithMsgID(ask.ID)); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := pjs.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for msg := range batch.Messages() {
		msgs = append(msgs, msg)
	}
	if len(msgs) != 2 {
		t.Fatalf("the predecessor fetched %d asks, want 2: %v", len(msgs), batch.Error())
	}
	fetched := time.Now()
	asks, err := claim.OpenAsks(ctx, pjs, mesh.BuildSeat, "m1", holder, seat.Token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asks.Claim(ctx, a.ID, a.Secret, 1, time.Time{}, msgs[0].Reply()); err != nil {
		t.Fatal(err)
	}
	l2, err := asks.Claim(ctx, a2.ID, a2.Secret, 1, time.Time{}, msgs[1].Reply())
	if err != nil {
		t.Fatal(err)
	}
	built, _ := json.Marshal(mesh.Built{Version: mesh.AskVersion, Ask: a2.ID, Plan: a2.Plan, Module: a2.Module, On: "m1", Attempt: 1,
		Digest: "sha256:" + strings.Repeat("ab", 32), Proof: mesh.AskProof(a2.Secret, a2.ID, "m1")})
	builtID := a2.ID + "-built-1"
	if err := l2.Announce(ctx, mesh.EventBuilt, builtID, built); err != nil {
		t.Fatal(err)
	}
	pnc.Close() // killed: no hand-back, no renewal, no announcement

	var logs testenv.Buffer
	done := startAgent(t, ctx, "m1", AgentOptions{NATS: s.ClientURL(), Creds: m1, BuildKit: bk,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	awaitLog(t, "the agent to hand the ask back", &logs, done, "handed back an ask this machine's previous holder left claimed")
	ccons, err := cjs.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the ask delivered again", func() bool {
		info, err := ccons.Info(ctx)
		return err == nil && info.Delivered.Consumer >= 2
	})
	if took, limit := time.Since(fetched), mesh.HolderAckWait*2/3; took >= limit {
		t.Errorf("the ask was delivered again %s after the predecessor fetched it: want within %s (handed back, not redelivered after the ack wait)", took, limit)
	}
	// The second is announced again under its recorded id, by the
	// restarted agent, and acknowledged: nothing of it waits the ack wait.
	events, err := cjs.Stream(ctx, mesh.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the recorded built announced again", func() bool {
		m, err := events.GetLastMsgForSubject(ctx, mesh.HolderEventSubject(mesh.BuildSeat, "m1", mesh.EventBuilt))
		return err == nil && m.Header.Get(jetstream.MsgIDHeader) == builtID
	})
	testenv.WaitFor(t, 10*time.Second, "the second ask acknowledged", func() bool {
		info, err := ccons.Info(ctx)
		return err == nil && info.NumAckPending <= 1 && info.NumPending == 0 && info.Delivered.Consumer >= 4
	})
	if took, limit := time.Since(fetched), mesh.HolderAckWait*2/3; took >= limit {
		t.Errorf("the ask whose outcome was recorded was announced and acknowledged %s after the predecessor fetched it: want within %s", took, limit)
	}
	if l := logs.String(); strings.Contains(strings.ToLower(l), "permissions violation") || !strings.Contains(l, "ask="+a.ID) {
		t.Errorf("the agent met refusals, or did not name the ask:\n%s", l)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunAgent: %v", err)
	}
}
