package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/registry"
)

// backFarm is a controller and build agents, each a real process's code
// (daemon.RunController, daemon.RunAgent), on a real server, with a real
// buildkitd pushing to the registry reg, building module app (FROM
// scratch) of a git repository of its own.
type backFarm struct {
	t      *testing.T
	ctx    context.Context
	url    string
	commit string
}

func newBackFarm(t *testing.T, reg string, tweak func(*agent.Config), machines ...string) *backFarm {
	t.Helper()
	bk := testenv.Buildkitd(t, reg)
	s := natstest.Server(t, nil)
	catDir := meshCatalogue(t)
	addModule(t, catDir, "app", "module: app\nbuild:\n  repo: "+fleetRepo+"\n  path: app\n")
	gitDir, _ := testenv.GitRepo(t, map[string]string{
		"app/Dockerfile": "FROM scratch\nCOPY hello.txt /hello.txt\n",
		"app/hello.txt":  "hello\n",
	})
	commit := testenv.Commit(t, gitDir, map[string]string{"app/VERSION": "2\n"})

	ctx, errs := registryFarm(t, s, catDir, reg, len(machines))
	for _, m := range machines {
		cfg := agent.DefaultConfig()
		cfg.Machine, cfg.FetchWait = m, 500*time.Millisecond
		tweak(&cfg)
		runFleetAgent(t, ctx, s, cfg, bk, gitDir, testenv.Log(t, m), errs)
	}
	return &backFarm{t: t, ctx: ctx, url: s.ClientURL(), commit: commit}
}

// builds runs the CLI; it returns its exit code and stdout.
func (f *backFarm) builds(args ...string) (int, string) {
	var out, errw bytes.Buffer
	code := cli.Main(f.ctx, append([]string{"--nats", f.url}, args...), &out, &errw)
	if code != 0 {
		f.t.Logf("builds %v: exit %d: %s", args, code, errw.String())
	}
	return code, out.String()
}

// push announces the commit and returns its plan.
func (f *backFarm) push() string {
	f.t.Helper()
	code, out := f.builds("--json", "push", "--repo", fleetRepo, "--commit", f.commit)
	var pushed struct {
		Plan string `json:"plan"`
	}
	if err := json.Unmarshal([]byte(out), &pushed); code != 0 || err != nil || pushed.Plan == "" {
		f.t.Fatalf("builds push: exit %d %q: %v", code, out, err)
	}
	return pushed.Plan
}

// app is module app of plan as `builds show --json` says it.
func (f *backFarm) app(plan string) cascade.ModuleStatus {
	_, out := f.builds("--json", "show", plan)
	var v cli.PlanView
	_ = json.Unmarshal([]byte(out), &v)
	for _, m := range v.Modules {
		if m.Module == "app" {
			return m
		}
	}
	return cascade.ModuleStatus{}
}

// poll checks cond every 150ms (each look runs the CLI) for at most d.
func poll(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

// A registry gone for good, two machines (issue 20, 4): each finds it gone
// on its push and turns sick. Meanwhile `builds show` says the module
// waits for a healthy machine, naming the registry — queued, on no
// machine, never "building on" a machine that gave it back; and the ask
// settles failed{infra} when its budget (--retry-for 6s) is gone, within
// 10% of it plus a second and a half to notice, with a message naming the
// registry; `builds retry` then takes it.
func TestARegistryGoneForGoodShowsWaitingThenSettlesFailedInfra(t *testing.T) {
	testenv.RequireBuildkit(t)
	addr := testenv.FreePorts(t, 1)
	srv, err := registry.Serve(context.Background(), addr, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const budget = 6 * time.Second
	f := newBackFarm(t, addr, func(c *agent.Config) { c.RetryFor = budget }, "m1", "m2")
	srv.Close() // gone for good
	plan := f.push()

	const waiting = "waiting for a healthy machine (given back by m" // 1 or 2: registry addr does not answer …
	// Until both machines are sick, one that is not yet may take the ask
	// again (and show it building there): the show and its JSON are
	// read until they say the same, a sick hand-back, at one moment.
	var (
		shown string
		noted cascade.ModuleStatus
	)
	poll(t, 90*time.Second, "builds show and its JSON say app waits for a healthy machine", func() bool {
		_, shown = f.builds("show", plan)
		if l := testenv.GrepLines(shown, "  app  "); !strings.Contains(l, waiting) || !strings.Contains(l, "registry "+addr+" does not answer") {
			return false
		}
		noted = f.app(plan)
		return noted.HandedBack != nil && noted.HandedBack.Sick
	})
	line := testenv.GrepLines(shown, "  app  ")
	t.Logf("builds show: %s", line)
	if !strings.Contains(line, " queued ") || strings.Contains(line, "building") || strings.Contains(line, " m1 ") || strings.Contains(line, " m2 ") {
		t.Errorf("app's line %q: want queued on no machine", line)
	}
	if noted.HandedBack.InfraSince.IsZero() || noted.On != "" {
		t.Fatalf("app %+v: want its JSON to carry a sick hand-back, the budget's start, on no machine", noted)
	}
	since := noted.HandedBack.InfraSince

	// builds machines: the sick machine's row says unhealthy, its cause
	// is said whole under the table, not in the row (which it would
	// widen, and every other row with it).
	sick := noted.HandedBack.On
	var machines string
	poll(t, 30*time.Second, "builds machines shows "+sick+" unhealthy", func() bool {
		_, machines = f.builds("machines")
		return strings.Contains(testenv.GrepLines(machines, sick+" "), " unhealthy ")
	})
	if l := testenv.GrepLines(machines, sick+" takes no asks until its probe passes: "); !strings.HasPrefix(l, sick) || !strings.Contains(l, "registry "+addr+" does not answer") {
		t.Errorf("builds machines does not say why %s is unhealthy under the table:\n%s", sick, machines)
	}
	for _, l := range strings.Split(machines, "\n") {
		if strings.HasPrefix(l, "m") && strings.Contains(l, " unhealthy") && strings.Contains(l, "does not answer") {
			t.Errorf("the cause is in the table's row %q", l)
		}
	}

	var done cascade.ModuleStatus
	poll(t, 60*time.Second, "app failed", func() bool { done = f.app(plan); return done.State == cascade.Failed })
	took := done.Finished.Sub(since)
	t.Logf("from app's first infrastructure failure to failed{infra} applied: %s (budget %s): %s", took.Round(time.Millisecond), budget, done.Message)
	if done.Reason != "infra" || !strings.Contains(done.Message, "no healthy machine: registry "+addr+" does not answer") || !strings.Contains(done.Message, "more than --retry-for 6s") {
		t.Errorf("app failed %s: %q, want infra, no healthy machine, naming registry %s", done.Reason, done.Message, addr)
	}
	if took < budget || took > budget+budget/10+1500*time.Millisecond {
		t.Errorf("settled %s after its budget began: want %s, +10%% and 1.5s to notice", took, budget)
	}
	if done.HandedBack != nil {
		t.Errorf("app failed still notes %+v", done.HandedBack)
	}
	if code, out := f.builds("retry", plan, "app"); code != 0 {
		t.Errorf("builds retry after it settled: exit %d %s", code, out)
	}
}

// A retry (issue 22): the registry answers 503 to the first push's uploads
// (its API root answers: the machine is healthy), so the agent gives the
// ask back to be retried after a delay; `builds show` says "retrying
// (attempt 1: …; next in …)" — queued, on no machine — and `builds watch`
// prints the same note; the second attempt builds it.
func TestARetryIsShownRetryingThenBuilds(t *testing.T) {
	testenv.RequireBuildkit(t)
	inner := registry.New(t.TempDir())
	var failing atomic.Bool
	failing.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() && strings.Contains(r.URL.Path, "/blobs/uploads/") {
			http.Error(w, "upstream connect error", http.StatusServiceUnavailable)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	reg := strings.TrimPrefix(srv.URL, "http://")
	f := newBackFarm(t, reg, func(c *agent.Config) {
		c.RetryFor, c.RetryDelay, c.MaxRetryDelay = time.Minute, 8*time.Second, 8*time.Second
	}, "m1")
	plan := f.push()
	var watched bytes.Buffer
	watchDone := make(chan int, 1)
	go func() {
		var errw bytes.Buffer
		watchDone <- cli.Main(f.ctx, []string{"--nats", f.url, "watch", plan}, &watched, &errw)
	}()

	var shown string
	poll(t, 90*time.Second, "builds show says app is retrying", func() bool {
		_, shown = f.builds("show", plan)
		return strings.Contains(shown, "retrying (attempt 1: ")
	})
	failing.Store(false)
	line := testenv.GrepLines(shown, "  app  ")
	t.Logf("builds show: %s", line)
	if !strings.Contains(line, " queued ") || strings.Contains(line, "building") || strings.Contains(line, " m1 ") ||
		!strings.Contains(line, "503") || !strings.Contains(line, "; next in ") {
		t.Errorf("app's line %q: want queued on no machine, retrying (attempt 1: <the registry's 503>; next in …)", line)
	}
	poll(t, 120*time.Second, "app built", func() bool { return f.app(plan).State == cascade.Built })
	if m := f.app(plan); m.On != "m1" || m.HandedBack != nil || len(m.Lost) != 0 {
		t.Errorf("app %+v: want built on m1, no note, nothing lost", m)
	}
	// builds logs has both attempts: the first's output to its end, a line,
	// the second's (each ends with a final batch: the first is not all).
	code, logs := f.builds("logs", plan, "app")
	again := strings.Index(logs, "── m1 started the ask again; its output follows ──")
	if code != 0 || again < 0 || !strings.Contains(logs[:again], "503") || !strings.Contains(logs[again:], "exporting to image") ||
		strings.Count(logs, "checking out ") != 2 {
		t.Errorf("builds logs exit %d, want the failed attempt, a line, the attempt that built:\n%s", code, logs)
	}
	select {
	case code := <-watchDone:
		if code != 0 || !strings.Contains(watched.String(), "app: retrying (attempt 1: ") {
			t.Errorf("builds watch exit %d printed:\n%s\nwant app's retry noted", code, watched.String())
		}
	case <-time.After(30 * time.Second):
		t.Error("builds watch did not end once the plan settled")
	}
}
