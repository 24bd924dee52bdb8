package farm

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

// `builds up --agents 0` runs a farm with no build agent of its own (it ran
// one before): its banner says how to start one by hand, and an agent
// started so — credentials issued from the farm's keys, the buildkitd the
// banner names — takes the build seat; until then nobody holds it.
func TestAFarmWithNoAgentsWaitsForOnesStartedByHand(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	catalogue, _ := testenv.SmallFleet(t, "base")
	state := t.TempDir()
	var out testenv.Buffer
	f, err := Up(ctx, UpOptions{
		Catalogue: catalogue, StateDir: state, ListenNATS: "127.0.0.1:0", ListenRegistry: testenv.FreePorts(t, 1), Agents: NoAgents,
		BuildkitdBin: testenv.BuildkitdBin(t), Log: testenv.Log(t, "farm"), Out: &out,
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	defer f.Stop()
	if m := f.Machines(); len(m) != 0 {
		t.Fatalf("machines %v, want none", m)
	}
	banner := out.String()
	for _, want := range []string{"agents      none of the farm's own", "builds creds issue " + CredsDir(state) + " --principal agent NAME",
		"build-agent -nats " + f.NATSURL() + " -creds NAME.creds -machine NAME -buildkit " + f.BuildKitAddr()} {
		if !strings.Contains(banner, want) {
			t.Errorf("the banner lacks %q:\n%s", want, banner)
		}
	}

	nc, _, err := daemon.Connect(f.NATSURL(), f.OperatorCreds(), mesh.OperatorPrincipal, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	holders := func() []string {
		r, err := deploy.Call(ctx, nc, mesh.SeatsTool, deploy.Request{})
		if err != nil {
			t.Fatalf("seats: %v", err)
		}
		var by []string
		for _, s := range r.Seats {
			if s.Seat == mesh.BuildSeat {
				for _, c := range s.Claims {
					by = append(by, c.Node)
				}
			}
		}
		return by
	}
	time.Sleep(time.Second)
	if h := holders(); len(h) != 0 {
		t.Fatalf("the build seat is held by %v with no agent started", h)
	}

	// An agent started by hand, as the banner says.
	cat, err := daemon.LoadCatalogue(catalogue, testenv.Log(t, "catalogue"))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := creds.Ensure(CredsDir(state))
	if err != nil {
		t.Fatal(err)
	}
	perms, err := cat.PrincipalPermissions(mesh.KindAgent, "by-hand")
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(t.TempDir(), "by-hand.creds")
	if err := keys.IssueFile(perms, "build-agent by-hand", credsFile); err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.Machine = "by-hand"
	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- daemon.RunAgent(actx, daemon.AgentOptions{
			NATS: f.NATSURL(), Creds: credsFile, Agent: cfg, BuildKit: f.BuildKitAddr(), RegistryClient: registry.NewClient(registry.WithInsecure(true)),
			Workspace: t.TempDir(), Catalogue: catalogue, Log: testenv.Log(t, "by-hand"),
		})
	}()
	defer func() { stop(); <-done }()
	testenv.WaitFor(t, 30*time.Second, "the agent started by hand holding the build seat", func() bool {
		h := holders()
		return len(h) == 1 && h[0] == "by-hand"
	})
}
