package cascade_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// A push whose commit the controller must fetch, from a git server that
// takes seconds to answer, is fetched beside the controller's loop, not
// in it: meanwhile the controller answers its tools at once (and would
// work every other plan's events); when the fetch is done the plan is
// made, its modules addressed (their trees read from the clone, so that
// early cutoff works). Meanwhile the store says the push is being fetched
// (cascade.Fetching, what builds watch waits on), and not after.
func TestAPushWhoseFetchIsSlowHoldsNothingUp(t *testing.T) {
	git, commit, nc, js, c := slowFleet(t)
	ctx := context.Background()

	pushed := time.Now()
	plan, _, err := cascade.Push(ctx, js, mesh.Pushed{Repo: meshtest.FleetRepo, Ref: "refs/heads/main", Commit: commit})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the push delivered, its fetch begun
	t0 := time.Now()
	_, err = cascade.Call(ctx, nc, c.Module(), cascade.ToolRetry, cascade.Request{Plan: "-"})
	answered := time.Since(t0)
	var te *cascade.ToolError
	if !errors.As(err, &te) {
		t.Fatalf("a tool call during the fetch: %v, want the controller's refusal", err)
	}
	t.Logf("a tool call during the fetch answered in %s", answered.Round(time.Millisecond))
	if answered > time.Second {
		t.Errorf("the controller answered a tool call in %s while a push's commit was fetched: its loop waited on the fetch", answered.Round(time.Millisecond))
	}

	store, err := cascade.OpenStore(ctx, js, c.Module())
	if err != nil {
		t.Fatal(err)
	}
	// Meanwhile the store says the push waits for its commit.
	if f, ok, err := store.FetchingFor(ctx, plan); err != nil || !ok || f.Commit != commit || f.Repo != meshtest.FleetRepo {
		t.Errorf("during the fetch, the store's record of it: %+v %t %v; want the push's repository and commit", f, ok, err)
	}
	testenv.WaitFor(t, 30*time.Second, "the push's plan", func() bool {
		_, err := store.Plan(ctx, plan)
		return err == nil
	})
	testenv.WaitFor(t, 5*time.Second, "the record of the fetch removed", func() bool {
		_, ok, err := store.FetchingFor(ctx, plan)
		return err == nil && !ok
	})
	if took := time.Since(pushed); took < slow {
		t.Errorf("the plan was made %s after the push, before the slow fetch could end: was the commit fetched?", took)
	}
	var mods map[string]cascade.ModuleStatus
	testenv.WaitFor(t, 5*time.Second, "the plan's modules stored", func() bool {
		mods, err = store.Modules(ctx, plan)
		return err == nil && mods["base"].Module != "" && mods["app"].Module != ""
	})
	for _, name := range []string{"base", "app"} {
		if m, ok := mods[name]; !ok || m.Tree == "" {
			t.Errorf("module %s: %+v, want its build context's tree read from the fetched clone", name, m)
		}
	}

	// Two pushes of the repository, the second while the first's commit
	// is fetched: planned in the order they came, both addressed.
	first := testenv.Commit(t, git, map[string]string{"app/Dockerfile": "FROM base\nRUN echo app 2 > /app\n"})
	second := testenv.Commit(t, git, map[string]string{"app/Dockerfile": "FROM base\nRUN echo app 3 > /app\n"})
	var plans []string
	for _, commit := range []string{first, second} {
		id, _, err := cascade.Push(ctx, js, mesh.Pushed{Repo: meshtest.FleetRepo, Ref: "refs/heads/main", Commit: commit})
		if err != nil {
			t.Fatal(err)
		}
		plans = append(plans, id)
	}
	var recs []cascade.PlanRecord
	testenv.WaitFor(t, 30*time.Second, "both pushes planned", func() bool {
		recs = recs[:0]
		for _, id := range plans {
			rec, err := store.Plan(ctx, id)
			if err != nil {
				return false
			}
			recs = append(recs, rec)
		}
		return true
	})
	if recs[0].Seq >= recs[1].Seq {
		t.Errorf("plan sequence numbers %d, %d: want the first push's older", recs[0].Seq, recs[1].Seq)
	}
	for i, id := range plans {
		testenv.WaitFor(t, 5*time.Second, "plan "+id+"'s app addressed", func() bool {
			mods, err := store.Modules(ctx, id)
			return err == nil && mods["app"].Tree != ""
		})
		t.Logf("push %d planned as %s, seq %d", i+1, id, recs[i].Seq)
	}
}

// A push's plan holds a module of another repository, built on a changed
// module at its current commit: that repository's HEAD, which its git
// server (slow, here) is asked for beside the controller's loop, with the
// push's commit. Meanwhile the controller answers its tools at once and
// the store says the plan waits for the fetch; then the plan is made, the
// other repository's module addressed at the HEAD fetched.
func TestAnotherRepositorysHeadIsFetchedBesideTheLoop(t *testing.T) {
	reg := registrytest.Registry(t)
	testenv.Busybox(t, reg)
	fleet, commit := testenv.GitRepo(t, map[string]string{
		"busybox/Dockerfile": "FROM scratch\n",
		"base/Dockerfile":    "FROM busybox\nRUN echo base > /base\n",
	})
	apps, head := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM base\nRUN echo app > /app\n"})
	const appsRepo = "https://git.example/apps.git"
	// The apps server waits slow (3s) before it answers; the fleet's at once.
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "remote.origin.uploadpack")
	t.Setenv("GIT_CONFIG_VALUE_0", `f() { case "$1" in *`+apps+`*) sleep 3;; esac; git-upload-pack "$1"; }; f`)

	s := natstest.Server(t, nil)
	nc, js := natstest.Connect(t, s)
	ms := append(meshtest.MeshManifests(t),
		&mesh.Manifest{Module: "busybox", Build: &mesh.Build{Repo: meshtest.FleetRepo, Path: "busybox"}},
		&mesh.Manifest{Module: "base", Build: &mesh.Build{Repo: meshtest.FleetRepo, Path: "base", On: []string{"busybox"}}},
		&mesh.Manifest{Module: "app", Build: &mesh.Build{Repo: appsRepo, Path: "app", On: []string{"base"}}})
	cat := mesh.NewCatalogue(ms)
	ctx := context.Background()
	c := sourcesController(t, nc, js, reg, cat, map[string]string{meshtest.FleetRepo: fleet, appsRepo: apps})
	store, err := cascade.OpenStore(ctx, js, c.Module())
	if err != nil {
		t.Fatal(err)
	}

	pushed := time.Now()
	plan, _, err := cascade.Push(ctx, js, mesh.Pushed{Repo: meshtest.FleetRepo, Ref: "refs/heads/main", Commit: commit, Paths: []string{"base/Dockerfile"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the push delivered, the fleet's fetch done, the apps' under way
	t0 := time.Now()
	_, err = cascade.Call(ctx, nc, c.Module(), cascade.ToolRetry, cascade.Request{Plan: "-"})
	answered := time.Since(t0)
	var te *cascade.ToolError
	if !errors.As(err, &te) {
		t.Fatalf("a tool call during the fetch: %v, want the controller's refusal", err)
	}
	if answered > time.Second {
		t.Errorf("the controller answered a tool call in %s while another repository's HEAD was fetched: its loop waited on the fetch", answered.Round(time.Millisecond))
	}
	if f, ok, err := store.FetchingFor(ctx, plan); err != nil || !ok {
		t.Errorf("during the fetch, the store's record of it: %+v %t %v; want one", f, ok, err)
	}
	var mods map[string]cascade.ModuleStatus
	testenv.WaitFor(t, 30*time.Second, "the plan's modules stored", func() bool {
		mods, err = store.Modules(ctx, plan)
		return err == nil && mods["base"].Module != "" && mods["app"].Module != ""
	})
	if took := time.Since(pushed); took < slow {
		t.Errorf("the plan was made %s after the push, before the apps' HEAD could be fetched", took)
	}
	if m := mods["app"]; m.Tree == "" || m.Source.Commit != head {
		t.Errorf("app: tree %q, commit %q; want its context's tree at the apps' HEAD %s", m.Tree, m.Source.Commit, head)
	}
	if m := mods["base"]; m.Tree == "" || m.Source.Commit != commit {
		t.Errorf("base: tree %q, commit %q; want its context's tree at the push's commit %s", m.Tree, m.Source.Commit, commit)
	}
}

// slow is how long slowFleet's git server waits before it answers.
const slow = 3 * time.Second

// slowFleet is a fleet repository (base on busybox, app on base) on a git
// server whose every upload-pack waits slow first (a slow server, or a big
// repository), its first commit, and a controller of it with clones
// (sourcesController) on a server of its own, pushing to a registry that
// holds busybox.
func slowFleet(t *testing.T) (git, commit string, nc *nats.Conn, js jetstream.JetStream, c *cascade.Controller) {
	t.Helper()
	reg := registrytest.Registry(t)
	testenv.Busybox(t, reg)
	git, commit = testenv.GitRepo(t, map[string]string{
		"base/Dockerfile": "FROM busybox\nRUN echo base > /base\n",
		"app/Dockerfile":  "FROM base\nRUN echo app > /app\n",
	})
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "remote.origin.uploadpack")
	t.Setenv("GIT_CONFIG_VALUE_0", fmt.Sprintf("sleep %d; git-upload-pack", int(slow.Seconds())))
	s := natstest.Server(t, nil)
	nc, js = natstest.Connect(t, s)
	cat := meshtest.Catalogue(t, map[string][]string{"busybox": nil, "base": {"busybox"}, "app": {"base"}})
	c = sourcesController(t, nc, js, reg, cat, map[string]string{meshtest.FleetRepo: git})
	return git, commit, nc, js, c
}

// sourcesController runs a controller of cat with clones of the
// repositories in insteadOf (Config.Sources), pushing to reg, until the
// test ends.
func sourcesController(t *testing.T, nc *nats.Conn, js jetstream.JetStream, reg string, cat *mesh.Catalogue, insteadOf map[string]string) *cascade.Controller {
	t.Helper()
	cfg := cascade.DefaultConfig()
	cfg.Registry, cfg.RegistryClient = reg, registry.NewClient(registry.WithInsecure(true))
	cfg.Sources, cfg.InsteadOf = t.TempDir(), insteadOf
	c, err := cascade.New(cfg, js, cat, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	cascadetest.Run(t, ctx, &wg, c, nc)
	return c
}

// A rebuild builds its modules at their repository's HEAD, which the git
// server (slow, here) is asked for beside the controller's loop: meanwhile
// the controller answers its other tools at once; the rebuild is answered
// when its plan is made, its modules addressed at the HEAD fetched.
func TestARebuildsHeadIsFetchedBesideTheLoop(t *testing.T) {
	_, head, nc, js, c := slowFleet(t)
	ctx := context.Background()

	type answer struct {
		r   cascade.Reply
		err error
		at  time.Duration
	}
	asked := time.Now()
	rebuilt := make(chan answer, 1)
	go func() {
		r, err := cascade.Call(ctx, nc, c.Module(), cascade.ToolRebuild, cascade.Request{ID: "slow-head", Modules: []string{"base", "app"}})
		rebuilt <- answer{r, err, time.Since(asked)}
	}()
	time.Sleep(300 * time.Millisecond) // the rebuild taken, its HEAD's fetch begun
	t0 := time.Now()
	_, err := cascade.Call(ctx, nc, c.Module(), cascade.ToolRetry, cascade.Request{Plan: "-"})
	answered := time.Since(t0)
	var te *cascade.ToolError
	if !errors.As(err, &te) {
		t.Fatalf("a tool call during the rebuild's fetch: %v, want the controller's refusal", err)
	}
	t.Logf("a tool call during the rebuild's fetch answered in %s", answered.Round(time.Millisecond))
	if answered > time.Second {
		t.Errorf("the controller answered a tool call in %s while a rebuild's HEAD was fetched: its loop waited on the fetch", answered.Round(time.Millisecond))
	}

	var a answer
	select {
	case a = <-rebuilt:
	case <-time.After(30 * time.Second):
		t.Fatal("the rebuild was not answered in 30s")
	}
	if a.err != nil || a.r.Plan == "" || !a.r.Created {
		t.Fatalf("the rebuild: %+v, %v; want its plan made", a.r, a.err)
	}
	if a.at < slow {
		t.Errorf("the rebuild was answered %s after it was asked, before the slow fetch could end: was its HEAD fetched?", a.at)
	}
	store, err := cascade.OpenStore(ctx, js, c.Module())
	if err != nil {
		t.Fatal(err)
	}
	var mods map[string]cascade.ModuleStatus
	testenv.WaitFor(t, 5*time.Second, "the plan's modules stored", func() bool {
		mods, err = store.Modules(ctx, a.r.Plan)
		return err == nil && mods["base"].Module != "" && mods["app"].Module != ""
	})
	for _, name := range []string{"base", "app"} {
		if m := mods[name]; m.Tree == "" || m.Source.Commit != head {
			t.Errorf("module %s: tree %q, commit %q; want its context's tree at the HEAD %s", name, m.Tree, m.Source.Commit, head)
		}
	}

	// The same request again: the plan exists, answered at once.
	t0 = time.Now()
	r, err := cascade.Call(ctx, nc, c.Module(), cascade.ToolRebuild, cascade.Request{ID: "slow-head", Modules: []string{"base", "app"}})
	if err != nil || r.Plan != a.r.Plan || r.Created {
		t.Errorf("the same rebuild again: %+v, %v; want plan %s, not made again", r, err, a.r.Plan)
	}
	if took := time.Since(t0); took > time.Second {
		t.Errorf("the same rebuild again answered in %s: its HEAD was fetched again for a plan that exists", took.Round(time.Millisecond))
	}
}
