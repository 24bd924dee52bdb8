package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/cmd/internal/demo"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/registry"
)

// TestUpKeepsItsStateByDefault is `builds up` as a new user runs it, on
// real parts: without --state it says where it keeps its state
// ($XDG_STATE_HOME/meshbuild/up here) and keeps it; a second builds up on
// that directory is refused, naming the first's pid; stopped and started
// again, still without --state, it has the plan and the image it built.
// --ephemeral and --state together are refused.
func TestUpKeepsItsStateByDefault(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, src := testenv.SmallFleet(t, "base")
	demoDir := t.TempDir()
	if err := os.Rename(catalogue, filepath.Join(demoDir, "catalogue")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(src, filepath.Join(demoDir, "src")); err != nil {
		t.Fatal(err)
	}
	xdg := t.TempDir()
	t.Setenv("MESHBUILD_STATE", "")
	t.Setenv("MESHBUILD_CREDS", "")
	t.Setenv("XDG_STATE_HOME", xdg)
	t.Setenv("PATH", filepath.Dir(testenv.BuildkitdBin(t))+string(os.PathListSeparator)+os.Getenv("PATH")) // as make does
	state := filepath.Join(xdg, "meshbuild", "up")
	addr := testenv.FreePorts(t, 2)
	host, port, _ := strings.Cut(addr, ":")
	var p int
	fmt.Sscan(port, &p)
	listen := []string{"--listen-nats", addr, "--listen-registry", fmt.Sprintf("%s:%d", host, p+1), "--agents", "1"}
	natsURL := "nats://" + addr

	// The demo: base built, the farm stopped, the state kept.
	var out, errw bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if code := cli.Main(ctx, append([]string{"up", "--demo", demoDir}, listen...), &out, &errw); code != 0 {
		t.Fatalf("builds up --demo: exit %d\n%s\n%s", code, out.String(), errw.String())
	}
	if !strings.Contains(out.String(), "State: "+state+" (kept") {
		t.Errorf("builds up does not say where its state is kept (%s):\n%s", state, out.String())
	}
	if _, err := os.Stat(filepath.Join(state, "registry")); err != nil {
		t.Fatalf("after the farm stopped, its state: %v", err)
	}

	// Up again without --state: the same state.
	upCtx, stop := context.WithCancel(ctx)
	var upOut, upErr testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Main(upCtx, append([]string{"up", "--catalogue", filepath.Join(demoDir, "catalogue")}, listen...), &upOut, &upErr)
	}()
	defer func() { stop(); <-done }()
	testenv.WaitFor(t, 2*time.Minute, "builds up to say the farm is up", func() bool {
		select {
		case code := <-done:
			done <- code
			t.Fatalf("builds up exited %d\n%s\n%s", code, upOut.String(), upErr.String())
		default:
		}
		return strings.Contains(upOut.String(), "The farm is up")
	})

	// A second farm on the same state is refused, naming the first.
	out.Reset()
	errw.Reset()
	if code := cli.Main(ctx, append([]string{"up", "--catalogue", filepath.Join(demoDir, "catalogue")}, listen...), &out, &errw); code == 0 ||
		!strings.Contains(errw.String(), fmt.Sprintf("state directory %s is in use by the farm of pid %d", state, os.Getpid())) {
		t.Errorf("a second builds up on %s: exit %d, stderr %q; want refused naming pid %d", state, code, errw.String(), os.Getpid())
	}

	// The plan and its image are still there; the operator's
	// credentials are found in the default state directory.
	out.Reset()
	errw.Reset()
	if code := cli.Main(ctx, []string{"--nats", natsURL, "--json", "plans"}, &out, &errw); code != 0 {
		t.Fatalf("builds plans: exit %d: %s", code, errw.String())
	}
	var plans []cascade.PlanRecord
	if err := json.Unmarshal(out.Bytes(), &plans); err != nil || len(plans) == 0 {
		t.Fatalf("builds plans after a restart: %v %s", err, out.String())
	}
	out.Reset()
	if code := cli.Main(ctx, []string{"--nats", natsURL, "--json", "show", plans[0].ID}, &out, &errw); code != 0 {
		t.Fatalf("builds show: exit %d: %s", code, errw.String())
	}
	var view cli.PlanView
	if err := json.Unmarshal(out.Bytes(), &view); err != nil {
		t.Fatal(err)
	}
	for _, m := range view.Modules {
		if m.Module != "base" {
			continue
		}
		if m.State != cascade.Built {
			t.Errorf("base after a restart: %+v", m)
		}
		if got, err := registry.NewClient().Resolve(ctx, m.Image); err != nil || got != m.Digest {
			t.Errorf("after a restart the image %s resolves to %s (%v)", m.Image, got, err)
		}
	}

	// A change pushed by hand to the demo's repository builds on the farm
	// resumed without --demo: its agents still fetch the demo's remote
	// from the repository in the state directory.
	repo := demo.Repo(state)
	if err := os.WriteFile(filepath.Join(repo, "base", "motd"), []byte("resumed without --demo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-c", "user.email=t@example.com", "-c", "user.name=t"}, args...)...)
		cmd.Dir = repo
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, b)
		}
		return strings.TrimSpace(string(b))
	}
	git("commit", "-qam", "base: a change pushed by hand")
	commit := git("rev-parse", "HEAD")
	out.Reset()
	errw.Reset()
	if code := cli.Main(ctx, []string{"--nats", natsURL, "push", "--repo", demo.Remote, "--commit", commit, "--path", "base"}, &out, &errw); code != 0 {
		t.Fatalf("builds push: exit %d: %s", code, errw.String())
	}
	m := regexp.MustCompile(`plan (p-[0-9a-f]+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("builds push named no plan: %q", out.String())
	}
	var base cascade.ModuleStatus
	testenv.WaitFor(t, 2*time.Minute, "the pushed plan to settle", func() bool {
		var o, e bytes.Buffer
		if cli.Main(ctx, []string{"--nats", natsURL, "--json", "show", m[1]}, &o, &e) != 0 {
			return false
		}
		var v cli.PlanView
		if json.Unmarshal(o.Bytes(), &v) != nil {
			return false
		}
		for _, mv := range v.Modules {
			if mv.Module == "base" {
				base = mv
			}
		}
		return base.State == cascade.Built || base.State == cascade.Failed
	})
	if base.State != cascade.Built {
		t.Errorf("a push to the demo's repository on the farm resumed without --demo: base %s (%s)", base.State, base.Message)
	}

	// --ephemeral and --state together are refused.
	errw.Reset()
	if code := cli.Main(ctx, []string{"up", "--catalogue", "x", "--ephemeral", "--state", t.TempDir()}, &out, &errw); code == 0 || !strings.Contains(errw.String(), "--ephemeral and --state") {
		t.Errorf("--ephemeral --state: exit %d, %q", code, errw.String())
	}
}

// A --log-level that is no level is refused before anything starts, naming
// the flag and the levels there are.
func TestUpRefusesALogLevelThatIsNone(t *testing.T) {
	var out, errw bytes.Buffer
	state := t.TempDir()
	code := cli.Main(context.Background(), []string{"up", "--catalogue", "x", "--state", state, "--log-level", "loud"}, &out, &errw)
	if code == 0 || !strings.Contains(errw.String(), `--log-level: "loud" is not a log level: write debug, info, warn or error`) {
		t.Fatalf("exit %d, %q", code, errw.String())
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("the state directory was written: %v", entries)
	}
}
