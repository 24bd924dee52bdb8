package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// TestAnAskForAPlatformNoMachineBuildsWaitsVisibly: a module declared for
// linux/arm64 only (FROM scratch, COPY: no emulation needed) while only an
// amd64 agent is online. `builds show` says its ask waits for a platform
// no online machine builds, and the controller's
// meshbuild_controller_asks_without_machine{platform="linux/arm64"} counts
// it. `builds machines` shows the agent's bound queue, not every platform
// its BuildKit worker lists. Then an agent of linux/arm64 arrives: the
// module is built, on it, and the note and the count are gone.
func TestAnAskForAPlatformNoMachineBuildsWaitsVisibly(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.BuildkitdWith(t, buildkitd.Options{RegistryHosts: []string{reg}, Platforms: []string{"linux/amd64", "linux/arm64", "linux/386"}})
	s := natstest.Server(t, nil)

	catDir := meshCatalogue(t)
	addModule(t, catDir, "armonly", "module: armonly\nbuild:\n  repo: "+fleetRepo+"\n  path: armonly\n  platforms: [linux/arm64]\n")
	gitDir, _ := testenv.GitRepo(t, map[string]string{
		"armonly/Dockerfile": "FROM scratch\nCOPY hello.txt /hello.txt\n",
		"armonly/hello.txt":  "hello\n",
	})
	commit := testenv.Commit(t, gitDir, map[string]string{"armonly/VERSION": "2\n"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	metricsAddr := testenv.FreePorts(t, 1)
	obs, err := daemon.ControllerMetrics(ctx, metricsAddr, s.ClientURL(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	copts := registryController(s, catDir, reg)
	copts.Controller.ObserveEvery = 500 * time.Millisecond
	copts.Observer = obs
	startController(t, ctx, copts, errs)
	startAgent := func(machine string, platforms ...string) {
		cfg := agent.DefaultConfig()
		cfg.Machine, cfg.Platforms = machine, platforms
		runFleetAgent(t, ctx, s, cfg, bk, gitDir, nil, errs)
	}
	startAgent("amd", "linux/amd64")

	var out, errw bytes.Buffer
	if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "--json", "push", "--repo", fleetRepo, "--commit", commit}, &out, &errw); code != 0 {
		t.Fatalf("builds push exit %d\nstdout %s\nstderr %s", code, out.String(), errw.String())
	}
	var pushed struct {
		Plan string `json:"plan"`
	}
	if err := json.Unmarshal(out.Bytes(), &pushed); err != nil || pushed.Plan == "" {
		t.Fatalf("decoding %q: %v", out.String(), err)
	}
	// show is what `builds show` prints of the plan ("" until the plan
	// is stored).
	show := func() string {
		out.Reset()
		errw.Reset()
		if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "show", pushed.Plan}, &out, &errw); code != 0 {
			t.Logf("builds show exit %d: %s", code, errw.String())
			return ""
		}
		return out.String()
	}
	unserved := func() float64 {
		line := testenv.GrepLines(testenv.Scrape(t, "http://"+metricsAddr+"/metrics"), `meshbuild_controller_asks_without_machine{platform="linux/arm64"}`)
		if line == "" {
			return 0
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		return v
	}
	const note = "waiting: no linux/arm64 machine online"
	// The controller counts a platform served until it has watched it for
	// a while (15s at least): the note comes after.
	var shown string
	testenv.WaitFor(t, 90*time.Second, "builds show says the ask waits for a linux/arm64 machine", func() bool {
		shown = show()
		return strings.Contains(shown, note)
	})
	if line := testenv.GrepLines(shown, note); !strings.Contains(line, "armonly") {
		t.Errorf("the note is not on armonly's line:\n%s", shown)
	}
	testenv.WaitFor(t, 30*time.Second, "the metric counts the waiting ask", func() bool { return unserved() == 1 })

	// builds machines: the amd agent holds the linux/amd64 queue; its
	// worker's other platforms are in --json only.
	out.Reset()
	if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "machines"}, &out, &errw); code != 0 {
		t.Fatalf("machines: %s", errw.String())
	}
	row := testenv.GrepLines(out.String(), "amd ")
	if !strings.Contains(row, " linux/amd64 ") || strings.Contains(row, "arm64") || strings.Contains(row, "386") {
		t.Errorf("machines row %q: want the bound platform, linux/amd64, alone\n%s", row, out.String())
	}
	out.Reset()
	if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "--json", "machines"}, &out, &errw); code != 0 {
		t.Fatalf("machines: %s", errw.String())
	}
	var ms []cli.Machine
	if err := json.Unmarshal(out.Bytes(), &ms); err != nil || len(ms) != 1 {
		t.Fatalf("machines %q: %v", out.String(), err)
	}
	if m := ms[0]; strings.Join(m.Platforms, ",") != "linux/amd64" || strings.Join(m.Builds, ",") != "linux/amd64" {
		t.Errorf("machine %+v: want platforms and builds [linux/amd64] (narrowed by --platforms)", m)
	}

	// A machine of the platform arrives (its worker lists three platforms;
	// it binds the two that have queues).
	startAgent("arm")
	testenv.WaitFor(t, 120*time.Second, "armonly built", func() bool {
		return strings.Contains(testenv.GrepLines(show(), "armonly"), "built")
	})
	testenv.WaitFor(t, 10*time.Second, "builds show answers", func() bool { shown = show(); return shown != "" })
	if strings.Contains(shown, "no linux/arm64 machine") || !strings.Contains(testenv.GrepLines(shown, "armonly"), "arm") {
		t.Errorf("after the arm machine came, show says:\n%s", shown)
	}
	testenv.WaitFor(t, 30*time.Second, "the metric back to 0", func() bool { return unserved() == 0 })
	out.Reset()
	if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "--json", "machines"}, &out, &errw); code != 0 {
		t.Fatalf("machines: %s", errw.String())
	}
	ms = nil
	if err := json.Unmarshal(out.Bytes(), &ms); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Machine == "arm" && (strings.Join(m.Platforms, ",") != "linux/amd64,linux/arm64" || !slices.Contains(m.Builds, "linux/386") || !slices.Contains(m.Builds, "linux/arm64")) {
			t.Errorf("machine %+v: want the queues it holds, linux/amd64 and linux/arm64, apart from every platform of its worker (linux/386 among them)", m)
		}
	}
	cancel()
}
