package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// agentBinary builds cmd/build-agent into a temporary directory: a build
// agent to run as a process of its own and kill.
func agentBinary(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "build-agent")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/build-agent")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/build-agent: %v\n%s", err, out)
	}
	return bin
}

// A build agent killed with SIGKILL in the middle of a build (its own
// process: no hand-back, no goodbye) loses its claim of the ask, and the
// machine idle beside it builds it. What an operator reads says so:
// `builds watch` as it happens, `builds show` names the silent machine and
// the one that took the ask, `builds logs` has the killed machine's output, a line saying where
// it stops and why, and the next machine's output to its end, and `builds
// machines` shows the killed machine offline, last seen when it started
// the build.
func TestAMachineKilledMidBuildIsShownLostInShowLogsAndMachines(t *testing.T) {
	a := newAppFarm(t, 6*time.Second, 1)
	s, bk, gitDir, bin, ctx, errs, f := a.s, a.bk, a.gitDir, a.bin, a.ctx, a.errs, a.f

	m1, _ := startAgentProcess(t, bin, s.ClientURL(), "m1", bk, gitDir)
	plan := f.push()
	var watched bytes.Buffer
	watchDone := make(chan int, 1)
	go func() {
		var errw bytes.Buffer
		watchDone <- cli.Main(ctx, []string{"--nats", f.url, "watch", plan}, &watched, &errw)
	}()
	f.running(plan, "m1")
	// m2 (idle all along from here) beside it; then m1 is killed.
	cfg := agent.DefaultConfig()
	cfg.Machine, cfg.FetchWait = "m2", 500*time.Millisecond
	runFleetAgent(t, ctx, s, cfg, bk, gitDir, testenv.Log(t, "m2"), errs)
	if err := m1.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = m1.Wait()
	killed := time.Now()

	poll(t, 90*time.Second, "app built", func() bool { return f.app(plan).State == cascade.Built })
	m := f.app(plan)
	t.Logf("built on %s %s after the kill", m.On, time.Since(killed).Round(time.Millisecond))
	if m.On != "m2" || len(m.Lost) != 1 {
		t.Fatalf("app %+v: want built on m2, m1 noted lost", m)
	}
	if l := m.Lost[0]; l.On != "m1" || l.TakenBy != "m2" || l.Started.IsZero() || !l.Taken.After(l.Started) {
		t.Errorf("lost %+v: want m1, started, then taken by m2", l)
	}

	code, shown := f.builds("show", plan)
	if code != 0 {
		t.Fatalf("builds show: exit %d", code)
	}
	if !strings.Contains(shown, "app: m1 went silent building it (started ") || !strings.Contains(shown, "; m2 took the ask at ") {
		t.Errorf("builds show does not say m1 went silent and m2 took the ask:\n%s", shown)
	}

	code, logs := f.builds("logs", plan, "app")
	if code != 0 {
		t.Fatalf("builds logs: exit %d", code)
	}
	cut := strings.Index(logs, "── m1's output stops here: it went silent, and m2 took the ask")
	if cut < 0 {
		t.Fatalf("builds logs does not say where m1's output stops:\n%s", logs)
	}
	before, after := logs[:cut], logs[cut:]
	if !strings.Contains(before, "step one") || strings.Contains(before, "exporting to image") {
		t.Errorf("the output before the line is not m1's cut short:\n%s", before)
	}
	if !strings.Contains(after, "step two") || !strings.Contains(after, "exporting to image") {
		t.Errorf("the output after the line is not m2's build to its end:\n%s", after)
	}

	for _, mc := range machines(t, f.url) {
		if mc.Machine == "m1" && (mc.Online || mc.LastSeen.Before(m.Lost[0].Started)) {
			t.Errorf("m1 %+v: want offline, last seen when it started app (%s)", mc, m.Lost[0].Started)
		}
	}
	select {
	case code := <-watchDone:
		if code != 0 || !strings.Contains(watched.String(), "app: m1 went silent building it") {
			t.Errorf("builds watch exit %d printed:\n%s\nwant m1's loss said", code, watched.String())
		}
	case <-time.After(30 * time.Second):
		t.Error("builds watch did not end once the plan settled")
	}
}

// appFarm is a controller on a server, a registry and a buildkitd, with one
// module, app, whose RUN step echoes "step one", sleeps and echoes "step
// two", and build-agent built to run as processes of their own.
type appFarm struct {
	s          *server.Server
	bk, gitDir string
	bin        string
	ctx        context.Context
	errs       chan<- error
	f          *backFarm
}

// newAppFarm starts an appFarm whose app sleeps sleep; agents is how many
// agents the test runs in process (registryFarm's daemons beside the
// controller).
func newAppFarm(t *testing.T, sleep time.Duration, agents int) appFarm {
	t.Helper()
	testenv.RequireBuildkit(t)
	bin := agentBinary(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	busybox := testenv.Busybox(t, reg)
	s := natstest.Server(t, nil)
	catDir := meshCatalogue(t)
	addModule(t, catDir, "app", "module: app\nbuild:\n  repo: "+fleetRepo+"\n  path: app\n")
	gitDir, _ := testenv.GitRepo(t, map[string]string{
		"app/Dockerfile": fmt.Sprintf("FROM %s\nCOPY hello.txt /hello.txt\nRUN echo step one && sleep %d && echo step two\n", busybox, int(sleep.Seconds())),
		"app/hello.txt":  "hello\n",
	})
	commit := testenv.Commit(t, gitDir, map[string]string{"app/VERSION": "2\n"})
	ctx, errs := registryFarm(t, s, catDir, reg, agents)
	return appFarm{s: s, bk: bk, gitDir: gitDir, bin: bin, ctx: ctx, errs: errs,
		f: &backFarm{t: t, ctx: ctx, url: s.ClientURL(), commit: commit}}
}

// startAgentProcess starts build-agent bin as machine on the bus at url, a
// process of its own, and waits until the machine is online.
func startAgentProcess(t *testing.T, bin, url, machine, bk, gitDir string) (*exec.Cmd, *testenv.Buffer) {
	t.Helper()
	var log testenv.Buffer
	cmd := exec.Command(bin, "--nats", url, "--machine", machine, "--buildkit", bk, "--workspace", t.TempDir(),
		"--git-instead-of", fleetRepo+"="+gitDir, "--registry-insecure", "--fetch-wait", "500ms", "--grace", "0s")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testenv.WaitFor(t, 30*time.Second, machine+" online", func() bool {
		for _, m := range machines(t, url) {
			if m.Machine == machine && m.Online {
				return true
			}
		}
		return false
	})
	return cmd, &log
}

// running waits until machine runs app's RUN step in plan.
func (f *backFarm) running(plan, machine string) {
	f.t.Helper()
	poll(f.t, 60*time.Second, machine+" running app's RUN step", func() bool {
		// Once the store says the machine builds it (push answers with
		// the plan's id before its record is stored, and the controller
		// stores a started with the module's next change or a moment
		// later).
		if f.app(plan).On != machine {
			return false
		}
		code, out := f.builds("logs", "--follow=false", plan, "app")
		if code != 0 {
			f.t.Fatalf("builds logs --follow=false of a build in flight: exit %d", code)
		}
		return strings.Contains(out, "step one")
	})
}

// A build agent killed with SIGKILL in the middle of a build and started
// again at once (as a supervisor restarts it) takes its seat over from its
// dead predecessor and hands back the ask that one held: the server
// delivers it again at once, and the restarted machine builds it, instead
// of the ask waiting out the holders' ack wait (8 s from the dead
// process's last heartbeat; seen by hand: the restarted agent idle, the
// ask started 8.0 s after it was queued).
func TestARestartedAgentHandsBackTheAskItsKilledPredecessorHeld(t *testing.T) {
	a := newAppFarm(t, 4*time.Second, 0)
	s, bk, gitDir, bin, f := a.s, a.bk, a.gitDir, a.bin, a.f

	m1, _ := startAgentProcess(t, bin, s.ClientURL(), "m1", bk, gitDir)
	plan := f.push()
	f.running(plan, "m1")
	if err := m1.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = m1.Wait()
	killed := time.Now()
	_, again := startAgentProcess(t, bin, s.ClientURL(), "m1", bk, gitDir)

	poll(t, 90*time.Second, "app built", func() bool { return f.app(plan).State == cascade.Built })
	m := f.app(plan)
	if m.On != "m1" || len(m.Lost) != 1 || m.Lost[0].On != "m1" || m.Lost[0].TakenBy != "m1" {
		t.Fatalf("app %+v: want built on m1 again, its first holder noted lost", m)
	}
	// Without the hand-back the server delivers the ask again once the
	// ack wait has passed since the dead process's last heartbeat (a
	// third of it): not before two thirds of it after the kill.
	took := m.Lost[0].Taken.Sub(killed)
	t.Logf("the ask started again %s after the kill", took.Round(time.Millisecond))
	if limit := mesh.HolderAckWait * 2 / 3; took >= limit {
		t.Errorf("the ask started again %s after the kill: want within %s, handed back by the restarted agent, not redelivered after the ack wait", took, limit)
	}
	if l := again.String(); !strings.Contains(l, "handed back an ask this machine's previous holder left claimed") {
		t.Errorf("the restarted agent does not say it handed the ask back:\n%s", l)
	}
	if code, shown := f.builds("show", plan); code != 0 || !strings.Contains(shown, "app: m1 went silent building it (started ") ||
		!strings.Contains(shown, "; its agent, restarted, began it again at ") {
		t.Errorf("builds show (exit %d) does not say m1 went silent and began the ask again:\n%s", code, shown)
	}
	code, logs := f.builds("logs", plan, "app")
	cut := strings.Index(logs, "── m1's output stops here: it went silent; its agent, restarted, began the ask again")
	if code != 0 || cut < 0 {
		t.Fatalf("builds logs (exit %d) does not say where the killed agent's output stops:\n%s", code, logs)
	}
	if before, after := logs[:cut], logs[cut:]; !strings.Contains(before, "step one") || strings.Contains(before, "exporting to image") ||
		!strings.Contains(after, "step two") || !strings.Contains(after, "exporting to image") {
		t.Errorf("builds logs: want the killed agent's output cut short, then the restarted one's to its end:\n%s", logs)
	}
}
