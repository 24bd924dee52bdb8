package cli_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// sleepy is a machine that builds by sleeping: the scheduler's part is
// what this test is about (BuildKit's is tested in agent/ and e2e).
type sleepy struct{ d time.Duration }

func (s sleepy) Work(ctx context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
		return agent.Result{}, context.Cause(ctx)
	}
	sum := sha256.Sum256([]byte(a.ID))
	dg := "sha256:" + hex.EncodeToString(sum[:])
	return agent.Result{Digest: dg, Ref: a.Image + "@" + dg}, nil
}

// TestPlansOfDifferentPrioritiesShowWhatTheyWaitBehind: a 30-module plan
// of priority 0 runs on 2 machines; a plan of priority 10 pushed beside it
// takes the machines as they free up. `builds plans` shows each plan's
// priority; `builds show` of the big plan says its waiting modules wait
// behind the urgent plan's machines. A third plan pushed at 0 waits behind
// the big one; `builds priority` raises it to 20, and it is built next.
func TestPlansOfDifferentPrioritiesShowWhatTheyWaitBehind(t *testing.T) {
	s := natstest.Server(t, nil)
	catDir := meshCatalogue(t)
	repos := map[string]int{"https://git.example/big.git": 30, "https://git.example/fix.git": 4, "https://git.example/later.git": 1}
	for repo, n := range repos {
		name := strings.TrimSuffix(strings.TrimPrefix(repo, "https://git.example/"), ".git")
		for i := range n {
			m := fmt.Sprintf("%s-%02d", name, i)
			y := "module: " + m + "\nbuild:\n  repo: " + repo + "\n  path: " + m + "\n"
			addModule(t, catDir, m, y)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 4)
	ccfg := cascade.DefaultConfig()
	ccfg.Registry = "127.0.0.1:1"
	ccfg.Images = testenv.AnyImage{} // its workers push nothing
	startController(t, ctx, daemon.ControllerOptions{NATS: s.ClientURL(), Catalogue: catDir, Controller: ccfg}, errs)
	for i := range 2 {
		nc, js := natstest.Dial(t, s.ClientURL())
		cfg := agent.DefaultConfig()
		cfg.Machine = fmt.Sprintf("host-%d", i+1)
		cfg.FetchWait = 500 * time.Millisecond
		a, err := agent.New(cfg, js, sleepy{400 * time.Millisecond}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done; nc.Close() })
	}

	run := func(args ...string) string {
		t.Helper()
		var out, errw bytes.Buffer
		if code := cli.Main(ctx, append([]string{"--nats", s.ClientURL()}, args...), &out, &errw); code != 0 {
			t.Fatalf("builds %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errw.String())
		}
		return out.String()
	}
	// try is run for a plan that may not be stored yet: "" until it is.
	try := func(args ...string) string {
		var out, errw bytes.Buffer
		if code := cli.Main(ctx, append([]string{"--nats", s.ClientURL()}, args...), &out, &errw); code != 0 {
			return ""
		}
		return out.String()
	}
	push := func(repo string, flags ...string) string {
		t.Helper()
		var p struct {
			Plan string `json:"plan"`
		}
		out := run(append([]string{"--json", "push", "--repo", repo, "--commit", "c1"}, flags...)...)
		if err := json.Unmarshal([]byte(out), &p); err != nil || p.Plan == "" {
			t.Fatalf("push: %q: %v", out, err)
		}
		return p.Plan
	}
	record := func(plan string) cascade.PlanRecord {
		var recs []cascade.PlanRecord
		if err := json.Unmarshal([]byte(run("--json", "plans")), &recs); err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.ID == plan {
				return r
			}
		}
		return cascade.PlanRecord{}
	}

	big := push("https://git.example/big.git", "--owner", "team")
	testenv.WaitFor(t, 20*time.Second, "the big plan building on both machines", func() bool { return record(big).Counts.Building == 2 })
	fix := push("https://git.example/fix.git", "--owner", "team", "--priority", "10")
	want := "waiting: 2 machines busy with plan " + fix + " (priority 10)"
	var shown string
	testenv.WaitFor(t, 20*time.Second, "builds show of the big plan to say it waits behind the urgent one", func() bool {
		shown = try("show", big)
		return strings.Contains(shown, want)
	})
	plans := run("plans")
	t.Logf("builds plans:\n%s", plans)
	t.Logf("builds show %s:\n%s", big, shown)
	t.Logf("builds show %s:\n%s", fix, run("show", fix))
	if row := testenv.GrepLines(plans, fix); !strings.Contains(row, "running  10 ") {
		t.Errorf("builds plans row of the urgent plan %q: want its priority, 10", row)
	}
	if !strings.Contains(plans, "PRIORITY") || !strings.Contains(testenv.GrepLines(shown, "priority 0"), "owner team") {
		t.Errorf("builds plans / show lack the priority:\n%s\n%s", plans, shown)
	}
	if r := record(fix); r.Priority != 10 || r.Owner != "team" {
		t.Errorf("builds plans --json: priority %d, owner %q; want 10, team", r.Priority, r.Owner)
	}
	testenv.WaitFor(t, 20*time.Second, "the urgent plan built", func() bool { return record(fix).Outcome == cascade.OutcomeBuilt })
	if r := record(big); r.Counts.Built+r.Counts.Building >= 30 {
		t.Fatalf("the big plan is nearly done (%+v): the test needs it running", r.Counts)
	}

	later := push("https://git.example/later.git", "--owner", "team")
	testenv.WaitFor(t, 10*time.Second, "the later plan held behind the big plan", func() bool {
		return strings.Contains(try("show", later), "waiting: 2 machines busy with plan "+big+" (priority 0)")
	})
	if out := run("priority", later, "20"); !strings.Contains(out, "plan "+later+": priority 20") {
		t.Errorf("builds priority said %q", out)
	}
	testenv.WaitFor(t, 10*time.Second, "the later plan built once raised", func() bool { return record(later).Outcome == cascade.OutcomeBuilt })
	if r := record(big); r.Outcome != cascade.OutcomeRunning {
		t.Errorf("the big plan is %s: the raised plan was built after it, not before", r.Outcome)
	}
	if r := record(later); r.Priority != 20 {
		t.Errorf("priority %d after builds priority 20", r.Priority)
	}
	var out, errw bytes.Buffer
	if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "priority", later, "9999"}, &out, &errw); code == 0 || !strings.Contains(errw.String(), "from -1000 to 1000") {
		t.Errorf("builds priority 9999: exit %d, %s", code, errw.String())
	}
	cancel()
}
