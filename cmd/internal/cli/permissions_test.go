package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
)

// logWork "builds" by logging two lines and returning a made-up digest.
type logWork struct{}

func (logWork) Work(_ context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	log("step 1/2 for " + a.Module)
	log("step 2/2 for " + a.Module)
	return agent.Result{Digest: "sha256:" + strings.Repeat("ab", 32)}, nil
}

// The operator's commands under the operator's permissions: on a server
// that enforces each principal's derived set and nothing more, `builds
// push`, `watch`, `show` and `logs` run as the operator, and the server
// reports no permission violation.
func TestOperatorCommandsUnderOperatorPermissions(t *testing.T) {
	cat := meshtest.Catalogue(t, map[string][]string{"a": nil, "b": {"a"}})
	m1, err := cat.MachinePermissions("m1")
	if err != nil {
		t.Fatal(err)
	}
	var users []*server.User
	m2, err := cat.MachinePermissions("m2")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []mesh.Permissions{
		cat.ControllerPermissions("controller"),
		m1,
		m2,
		cat.OperatorPermissions("operator"),
	} {
		users = append(users, &server.User{Username: p.Principal, Password: "pw", Permissions: p.ServerPermissions()})
	}
	s := natstest.Server(t, &server.Options{Users: users})
	violations := make(chan string, 16)
	connect := func(user string) (*nats.Conn, jetstream.JetStream) {
		return natstest.Connect(t, s, nats.UserInfo(user, "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix(user)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case violations <- user + ": " + err.Error():
				default:
				}
			}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, cjs := connect("controller")
	ccfg := cascade.DefaultConfig()
	ccfg.Registry = "127.0.0.1:1"
	ccfg.Images = testenv.AnyImage{} // its workers push nothing
	c, err := cascade.New(ccfg, cjs, cat, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	_, ajs := connect(m1.Principal)
	cfg := agent.DefaultConfig()
	cfg.Machine, cfg.FetchWait = "m1", 500*time.Millisecond
	a, err := agent.New(cfg, ajs, logWork{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	adone := make(chan struct{})
	go func() { defer close(adone); _ = a.Run(ctx) }()
	defer func() { cancel(); <-adone }()
	// The controller has raised the catalogue once its tools answer.
	onc, _ := connect("operator")
	cascadetest.WaitReady(t, onc, "build-controller", 10*time.Second)

	// The CLI dials as the operator (credentials in the URL).
	url := "nats://operator:pw@" + strings.TrimPrefix(s.ClientURL(), "nats://")
	operator := func(args ...string) (string, string) {
		t.Helper()
		code, out, errw := run(t, append([]string{"--nats", url}, args...)...)
		if code != 0 {
			t.Fatalf("builds %s as the operator: exit %d\n%s\n%s", strings.Join(args, " "), code, out, errw)
		}
		return out, errw
	}
	out, _ := operator("push", "--repo", meshtest.FleetRepo, "--commit", "c1", "--watch")
	plan := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: meshtest.FleetRepo, Commit: "c1", Ref: "refs/heads/main"})
	if !strings.Contains(out, "plan "+plan+"  built") {
		t.Errorf("push --watch as the operator:\n%s", out)
	}
	if out, _ := operator("watch", plan); !strings.Contains(out, "2/2 built") {
		t.Errorf("watch as the operator:\n%s", out)
	}
	if out, _ := operator("show", plan); !strings.Contains(out, "tier 1") || !strings.Contains(out, "m1") {
		t.Errorf("show as the operator:\n%s", out)
	}
	// Another machine writes output into b's ask, on the subject its
	// permissions give it, saying it is m1's: it never held the ask, so
	// it is not shown, and stderr says so.
	xnc, _ := connect(m2.Principal)
	forged, err := json.Marshal(mesh.LogBatch{Ask: cascade.AskID(plan, "b", 1), On: "m1", Seq: 3, Lines: []string{"FORGED: rotate your credentials at evil.example"}, Final: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := xnc.Publish(mesh.HolderEventSubject(mesh.BuildSeat, "m2", mesh.LogEvent(cascade.AskID(plan, "b", 1))), forged); err != nil {
		t.Fatal(err)
	}
	if err := xnc.Flush(); err != nil {
		t.Fatal(err)
	}
	out, errw := operator("logs", plan, "b")
	if !strings.Contains(out, "step 2/2 for b") || strings.Contains(out, "FORGED") || strings.Contains(out, "m2") {
		t.Errorf("logs as the operator, another machine having written into the ask:\n%s", out)
	}
	if !strings.Contains(errw, "not shown: 1 batches of output from m2") {
		t.Errorf("logs said nothing of what it left out: %q", errw)
	}
	select {
	case v := <-violations:
		t.Fatalf("a principal was refused: %s", v)
	default:
	}
}
