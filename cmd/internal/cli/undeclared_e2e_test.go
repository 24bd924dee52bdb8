package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// A Dockerfile FROM a module of the catalogue that its manifest's build.on
// does not list fails at once as a source error that names the line and
// the fix, on the real farm (controller, build-agent with its catalogue,
// buildkitd, registry). Before, BuildKit looked the module's name up on
// Docker Hub, and the ask was retried as the registry's failure for the
// whole --retry-for (5 minutes) and failed{infra} "registry unreachable".
func TestAFromOfAModuleNotInBuildOnFailsAtOnceAsASourceError(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	busybox := testenv.Busybox(t, reg)
	s := natstest.Server(t, nil)
	catDir := meshCatalogue(t)
	addModule(t, catDir, "lib", "module: lib\nbuild:\n  repo: "+fleetRepo+"\n  path: lib\n")
	addModule(t, catDir, "app", "module: app\nbuild:\n  repo: "+fleetRepo+"\n  path: app\n")
	gitDir, _ := testenv.GitRepo(t, map[string]string{
		"lib/Dockerfile": "FROM " + busybox + "\nRUN echo lib > /lib.txt\n",
		"app/Dockerfile": "# app forgets build.on: [lib]\nFROM lib\nRUN cat /lib.txt\n",
	})
	commit := testenv.Commit(t, gitDir, map[string]string{"app/VERSION": "2\n", "lib/VERSION": "2\n"})

	ctx, errs := registryFarm(t, s, catDir, reg, 1)
	cfg := agent.DefaultConfig()
	cfg.Machine, cfg.FetchWait = "m1", 500*time.Millisecond
	opts := daemon.AgentOptions{NATS: s.ClientURL(), Agent: cfg, BuildKit: bk, Catalogue: catDir,
		RegistryClient: registry.NewClient(registry.WithInsecure(true)), Workspace: t.TempDir(),
		InsteadOf: map[string]string{fleetRepo: gitDir}, Log: testenv.Log(t, "m1")}
	go func() { errs <- daemon.RunAgent(ctx, opts) }()

	f := &backFarm{t: t, ctx: ctx, url: s.ClientURL(), commit: commit}
	pushed := time.Now()
	plan := f.push()
	var app cascade.ModuleStatus
	poll(t, 60*time.Second, "app settled", func() bool {
		app = f.app(plan)
		return app.State == cascade.Failed || app.State == cascade.Built
	})
	t.Logf("app %s %s after the push: %s", app.State, time.Since(pushed).Round(time.Millisecond), app.Message)
	if app.State != cascade.Failed || app.Reason != "source" || app.Attempt != 1 ||
		!strings.Contains(app.Message, "Dockerfile:2: FROM lib names module lib of the catalogue") ||
		!strings.Contains(app.Message, "add lib to the build.on of app") {
		t.Fatalf("app %+v: want failed{source} on its first attempt, naming the line and the fix", app)
	}
}
