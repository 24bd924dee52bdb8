package farm_test

// Up end to end with real BuildKit, the demo's plan as the work: the
// banner, the /metrics of every process, one buildkitd per agent, and Stop
// letting go of everything. The demo package's own tests are in
// cmd/internal/demo.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bkclient "github.com/moby/buildkit/client"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/cmd/internal/demo"
	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/cmd/internal/farm/farmtest"
	"github.com/meshbuild/meshbuild/cmd/internal/planview"
	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	mstate "github.com/meshbuild/meshbuild/state"
)

// The embedded default end to end: Up on free ports with two agents, and
// the demo building a base, a runtime on it and two tools on that, each
// pulled by one of the farm's machines.
func TestUpDemo(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, src := testenv.SmallFleet(t, "base", "runtime", "tool-01", "tool-02")
	state := t.TempDir()
	var banner bytes.Buffer
	metricsBase := testenv.FreePorts(t, 3)
	f, logs, stop := farmtest.Up(t, farm.UpOptions{
		Catalogue: catalogue, Agents: 2, StateDir: state,
		MetricsBase: metricsBase, InsteadOf: demo.InsteadOf(state), Out: &banner,
	})
	defer stop()

	for what, addr := range map[string]string{"NATS": f.NATSURL(), "registry": f.RegistryAddr()} {
		if strings.HasSuffix(addr, ":0") || !strings.Contains(banner.String(), addr) {
			t.Errorf("%s address %q: want the bound port, printed in\n%s", what, addr, banner.String())
		}
	}
	if !strings.Contains(banner.String(), "export MESHBUILD_NATS="+f.NATSURL()) {
		t.Errorf("the banner does not say where to point builds:\n%s", banner.String())
	}
	machines := f.Machines()
	if len(machines) != 2 || machines[0] == machines[1] || !strings.HasSuffix(machines[0], "-a1") {
		t.Fatalf("Machines = %v, want two distinct <host>-aN", machines)
	}
	if bks := f.BuildKitAddrs(); len(bks) != 2 || bks[0] != bks[1] || bks[0] != f.BuildKitAddr() {
		t.Errorf("BuildKitAddrs = %v, want the one buildkitd %s for both agents", bks, f.BuildKitAddr())
	}
	// A farm runs for long: its buildkitd collects its cache (BuildKit's
	// default policies), where one that never did filled the disk.
	if bk, err := bkclient.New(context.Background(), f.BuildKitAddr()); err != nil {
		t.Error(err)
	} else {
		ws, err := bk.ListWorkers(context.Background())
		bk.Close()
		if err != nil || len(ws) == 0 || len(ws[0].GCPolicy) == 0 {
			t.Errorf("the farm's buildkitd: workers %+v, %v; want its cache collected", ws, err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := demo.Run(ctx, f, src, &out); err != nil {
		t.Fatalf("demo.Run: %v\n%s", err, out.String())
	}
	t.Logf("demo output:\n%s", out.String())

	nc, js, err := daemon.Connect(f.NATSURL(), f.OperatorCreds(), mesh.OperatorPrincipal, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	store, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
	plans, err := store.Plans(ctx)
	if err != nil || len(plans) != 1 {
		t.Fatalf("Plans = %v, %v; want the demo's one", plans, err)
	}
	rec := plans[0]
	if rec.Outcome != cascade.OutcomeBuilt || rec.Counts.Built != 4 || rec.Tiers != 3 {
		t.Errorf("plan %s: outcome %s, counts %+v, tiers %d; want 4 modules built in 3 tiers", rec.ID, rec.Outcome, rec.Counts, rec.Tiers)
	}
	mods, err := store.Modules(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]int{}
	for _, name := range []string{"base", "runtime", "tool-01", "tool-02"} {
		m, ok := mods[name]
		switch {
		case !ok:
			t.Errorf("%s is not in the plan", name)
		case m.State != cascade.Built || !strings.HasPrefix(m.Digest, "sha256:"):
			t.Errorf("%s: %s %q, want built with a digest (%s)", name, m.State, m.Digest, m.Message)
		case !slices.Contains(machines, m.On):
			t.Errorf("%s built on %q, not one of %v", name, m.On, machines)
		default:
			used[m.On]++
			if !strings.Contains(out.String(), planview.ShortDigest(m.Digest)) {
				t.Errorf("the demo's output lacks %s's digest %s", name, planview.ShortDigest(m.Digest))
			}
		}
	}
	t.Logf("builds per machine: %v", used)
	// Each machine's build agent, carried by its node, kept its last build
	// of each module through the state surface its node was issued, under
	// the node's credentials: an operator reads them.
	cat, _, err := mesh.Load(catalogue)
	if err != nil {
		t.Fatal(err)
	}
	records := mstate.New(js, mesh.OperatorPrincipal, cat.OperatorBuckets())
	for name, m := range mods {
		e, err := records.Get(ctx, mesh.AgentBuildsRef(), mesh.BuildRecordKey(name, m.On))
		if err != nil {
			t.Errorf("%s's record on %s: %v", name, m.On, err)
			continue
		}
		var r mesh.BuildRecord
		if err := json.Unmarshal(e.Value, &r); err != nil || r.Outcome != mesh.EventBuilt || r.Duration <= 0 || r.Module != name || r.Machine != m.On || !strings.HasPrefix(r.Digest, "sha256:") {
			t.Errorf("%s's record on %s: %s (%v); want built, with its duration and digest", name, m.On, e.Value, err)
		}
	}
	for _, want := range []string{"tier 0", "tier 2", "machines", "plan " + rec.ID + "  built"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if !strings.Contains(logs.String(), "component=agent") {
		t.Errorf("no agent logged to the farm's log")
	}
	// NATS enforced every component's credentials, and refused none of them.
	if v := testenv.GrepLines(logs.String(), "Violation"); v != "" {
		t.Errorf("NATS refused a component something its derived set lacks:\n%s", v)
	}

	// Every process's /metrics: the controller's on the base port, agent i
	// on the port i above it, each printed in the banner.
	_, port, _ := farm.SplitAddr(metricsBase)
	scrapes := map[string]string{
		"127.0.0.1:" + strconv.Itoa(port):   `meshbuild_controller_plans_settled_total{outcome="built"} 1`,
		"127.0.0.1:" + strconv.Itoa(port+1): `meshbuild_agent_builds_total{machine="` + machines[0] + `",outcome="built",reason=""} ` + strconv.Itoa(used[machines[0]]),
		"127.0.0.1:" + strconv.Itoa(port+2): `meshbuild_agent_builds_total{machine="` + machines[1] + `",outcome="built",reason=""} ` + strconv.Itoa(used[machines[1]]),
	}
	for addr, want := range scrapes {
		url := "http://" + addr + "/metrics"
		if !strings.Contains(banner.String(), url) {
			t.Errorf("the banner does not name %s:\n%s", url, banner.String())
		}
		// The observers are told just after the state the demo reads.
		var body string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if body = testenv.Scrape(t, url); strings.Contains(body, want) || time.Now().After(deadline) {
				break
			}
		}
		if !strings.Contains(body, want) {
			t.Errorf("%s lacks %s:\n%s", url, want, testenv.GrepLines(body, "meshbuild_"))
		}
	}

	if err := f.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if err := f.Wait(); err != nil {
		t.Errorf("Wait after Stop: %v", err)
	}
	// Everything let go of its address.
	for _, addr := range []string{strings.TrimPrefix(f.NATSURL(), "nats://"), f.RegistryAddr()} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s is still held after Stop: %v", addr, err)
			continue
		}
		ln.Close()
	}
	if _, err := os.Stat(state); err != nil {
		t.Errorf("the given state directory is gone: %v", err)
	}
}

// BuildkitdPerAgent: each agent builds with a buildkitd of its own, with
// its own state and socket and the max-parallelism asked for, each trusting
// the registry; a plan builds across them; one that exits is started again
// at its address, and the next plan builds; one that keeps exiting fails
// the farm, naming whose it was;
// Stop stops them all.
func TestUpBuildkitdPerAgent(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, src := testenv.SmallFleet(t, "base", "runtime", "tool-01", "tool-02")
	state := t.TempDir()
	var banner bytes.Buffer
	f, _, stop := farmtest.Up(t, farm.UpOptions{
		Catalogue: catalogue, Agents: 2, StateDir: state,
		BuildkitdPerAgent: true, MaxParallelism: 1,
		InsteadOf: demo.InsteadOf(state), Out: &banner,
	})
	defer stop()

	machines, addrs := f.Machines(), f.BuildKitAddrs()
	if len(addrs) != 2 || addrs[0] == addrs[1] || f.BuildKitAddr() != addrs[0] {
		t.Fatalf("BuildKitAddrs = %v, BuildKitAddr = %s; want two daemons, the first agent's first", addrs, f.BuildKitAddr())
	}
	for i, m := range machines {
		if want := addrs[i] + " (started here for " + m + ", max-parallelism 1)"; !strings.Contains(banner.String(), want) {
			t.Errorf("the banner lacks %q:\n%s", want, banner.String())
		}
		conf, err := os.ReadFile(filepath.Join(state, "buildkitd-"+m, "buildkitd.toml"))
		if err != nil {
			t.Fatalf("the buildkitd of %s: %v", m, err)
		}
		for _, want := range []string{"max-parallelism = 1", `[registry."` + f.RegistryAddr() + `"]`, strings.TrimPrefix(addrs[i], "unix://")} {
			if !strings.Contains(string(conf), want) {
				t.Errorf("the buildkitd.toml of %s lacks %s:\n%s", m, want, conf)
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := demo.Run(ctx, f, src, &out); err != nil {
		t.Fatalf("demo.Run: %v\n%s", err, out.String())
	}

	// A daemon that exits is started again where it listened; the farm
	// goes on, and builds the next plan.
	werr := make(chan error, 1)
	go func() { werr <- f.Wait() }()
	again := func() bool {
		t.Helper()
		if err := farm.StopBuildkitd(f, 1); err != nil {
			t.Fatalf("stopping the second buildkitd: %v", err)
		}
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
			select {
			case err := <-werr:
				werr <- err
				return false
			case <-time.After(200 * time.Millisecond):
			}
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			err := buildkitd.Ping(pctx, addrs[1])
			pcancel()
			if err == nil {
				return true
			}
		}
		t.Fatalf("the buildkitd of %s neither answered again at %s within a minute nor failed the farm", machines[1], addrs[1])
		return false
	}
	if !again() {
		t.Fatalf("the farm failed when a buildkitd exited once: %v", <-werr)
	}
	out.Reset()
	if err := demo.Run(ctx, f, src, &out); err != nil {
		t.Fatalf("demo.Run after the buildkitd of %s was started again: %v\n%s", machines[1], err, out.String())
	}

	// One that keeps exiting as soon as it is started fails the farm,
	// naming whose it was.
	failed := false
	for range 5 {
		if !again() {
			failed = true
			break
		}
	}
	if !failed {
		t.Fatalf("a buildkitd that exited again and again did not fail the farm")
	}
	if err := <-werr; err == nil || !strings.Contains(err.Error(), "the buildkitd of "+machines[1]+" exited 3 times in a row") {
		t.Errorf("Wait = %v, want the buildkitd of %s exited 3 times in a row", err, machines[1])
	}

	if err := f.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	for _, a := range addrs {
		sock := strings.TrimPrefix(a, "unix://")
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after Stop: %v", sock, err)
		}
	}
}
