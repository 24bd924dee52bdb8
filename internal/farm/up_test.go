package farm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// exampleFleet is examples/fleet in the repository.
func exampleFleet(t testing.TB) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "examples", "fleet")
}

// smallFleet copies part of the example fleet: the catalogue's manifests
// of the farm's own modules and of modules, and their sources.
func smallFleet(t *testing.T, modules ...string) (catalogue, src string) {
	t.Helper()
	fleet := exampleFleet(t)
	catalogue, src = t.TempDir(), t.TempDir()
	for _, m := range append([]string{"git", "build-agent", "build-controller"}, modules...) {
		data, err := os.ReadFile(filepath.Join(fleet, "catalogue", m+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(catalogue, m+".yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range modules {
		dir := m
		if strings.HasPrefix(m, "tool-") {
			dir = filepath.Join("tools", m)
		}
		if err := os.MkdirAll(filepath.Join(src, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := copyTree(filepath.Join(fleet, "src", dir), filepath.Join(src, dir)); err != nil {
			t.Fatal(err)
		}
	}
	return catalogue, src
}

// A taken address refuses the start in words that say what to do, before
// anything needs buildkitd.
func TestUpRefusesTakenPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().String()
	catalogue, _ := smallFleet(t)

	for _, tc := range []struct {
		name, nats, registry, want string
	}{
		{"nats", taken, "127.0.0.1:0", taken + " is in use: stop what holds it or pass --listen-nats 127.0.0.1:PORT"},
		{"registry", "127.0.0.1:0", taken, taken + " is in use: stop what holds it or pass --listen-registry 127.0.0.1:PORT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			f, err := Up(context.Background(), UpOptions{
				Catalogue: catalogue, StateDir: state, ListenNATS: tc.nats, ListenRegistry: tc.registry,
				BuildkitdBin: "/nonexistent/buildkitd",
			})
			if err == nil {
				f.Stop()
				t.Fatal("Up started on a taken port")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Up: %v\nwant it to say %q", err, tc.want)
			}
			if !errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("Up: %v: want errors.Is EADDRINUSE", err)
			}
			var inUse *AddrInUseError
			if !errors.As(err, &inUse) || inUse.Addr != taken {
				t.Errorf("Up: %v: want an *AddrInUseError for %s", err, taken)
			}
			// What started (NATS, for the registry case) was stopped: its
			// port is free again and nothing is left running.
			if _, err := os.Stat(state); err != nil {
				t.Errorf("a given state directory was removed: %v", err)
			}
		})
	}
}

// A taken metrics port is refused like the others; so is a buildkitd
// that is not there, saying how to get one. Neither leaves anything
// running.
func TestUpRefusesMetricsPortAndMissingBuildkitd(t *testing.T) {
	catalogue, _ := smallFleet(t)
	base := freePorts(t, 2)
	_, port, _ := splitAddr(base)
	agentAddr := "127.0.0.1:" + strconv.Itoa(port+1)
	ln, err := net.Listen("tcp", agentAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct {
		name    string
		metrics string
		want    []string
	}{
		{"agent's metrics port taken", base, []string{agentAddr + " is in use: stop what holds it or pass --metrics 127.0.0.1:PORT"}},
		{"no buildkitd", "", []string{"/nonexistent/buildkitd", "make deps", "--buildkit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			natsAddr := freePorts(t, 1)
			f, err := Up(context.Background(), UpOptions{
				Catalogue: catalogue, StateDir: t.TempDir(), ListenNATS: natsAddr, ListenRegistry: "127.0.0.1:0",
				MetricsBase: tc.metrics, BuildkitdBin: "/nonexistent/buildkitd",
			})
			if err == nil {
				f.Stop()
				t.Fatal("Up started")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Up: %v\nwant it to say %q", err, w)
				}
			}
			// NATS, started first, was stopped again.
			l, err := net.Listen("tcp", natsAddr)
			if err != nil {
				t.Errorf("NATS's %s is still held: %v", natsAddr, err)
			} else {
				l.Close()
			}
		})
	}
}

func TestUpRefusesBadOptions(t *testing.T) {
	catalogue, _ := smallFleet(t)
	for _, tc := range []struct {
		name string
		o    UpOptions
		want string
	}{
		{"no catalogue", UpOptions{}, "--catalogue"},
		{"missing catalogue", UpOptions{Catalogue: "/nonexistent"}, "not a directory"},
		{"negative agents", UpOptions{Catalogue: catalogue, Agents: -1}, "agents -1"},
		{"bad nats address", UpOptions{Catalogue: catalogue, ListenNATS: "4222"}, "--listen-nats"},
		{"metrics on port 0", UpOptions{Catalogue: catalogue, MetricsBase: "127.0.0.1:0"}, "--metrics"},
		{"negative max parallelism", UpOptions{Catalogue: catalogue, MaxParallelism: -1}, "max parallelism -1"},
		{"a given buildkitd per agent", UpOptions{Catalogue: catalogue, BuildKit: "unix:///run/bk.sock", BuildkitdPerAgent: true},
			"--buildkit unix:///run/bk.sock names the one buildkitd to use"},
		{"max parallelism of a given buildkitd", UpOptions{Catalogue: catalogue, BuildKit: "unix:///run/bk.sock", MaxParallelism: 1},
			"set max-parallelism in its buildkitd.toml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Up(context.Background(), tc.o)
			if !errors.Is(err, ErrUpOptions) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Up: %v, want ErrUpOptions saying %q", err, tc.want)
			}
		})
	}
}

// buildkitdBin is the repository's bin/buildkitd.
func buildkitdBin(t testing.TB) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "bin", "buildkitd")
}

// The embedded default end to end: Up on free ports with two agents, and
// the demo building a base, a runtime on it and two tools on that, each
// pulled by one of the farm's machines.
func TestUpDemo(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, src := smallFleet(t, "base", "runtime", "tool-01", "tool-02")
	state := t.TempDir()
	logs := &syncWriter{w: &bytes.Buffer{}}
	var banner bytes.Buffer
	metricsBase := freePorts(t, 3)
	f, err := Up(context.Background(), UpOptions{
		Catalogue: catalogue, Agents: 2, StateDir: state,
		ListenNATS: "127.0.0.1:0", ListenRegistry: "127.0.0.1:0",
		MetricsBase:  metricsBase,
		BuildkitdBin: buildkitdBin(t),
		InsteadOf:    DemoInsteadOf(state),
		Log:          slog.New(slog.NewTextHandler(logs, nil)),
		Out:          &banner,
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			f.Stop()
		}
		if t.Failed() {
			t.Logf("farm log:\n%s", logs.String())
		}
	}()

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

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Demo(ctx, f, src, &out); err != nil {
		t.Fatalf("Demo: %v\n%s", err, out.String())
	}
	t.Logf("demo output:\n%s", out.String())

	nc, js, err := Connect(f.NATSURL(), "", "builds", "test")
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
			if !strings.Contains(out.String(), shortDigest(m.Digest)) {
				t.Errorf("the demo's output lacks %s's digest %s", name, shortDigest(m.Digest))
			}
		}
	}
	t.Logf("builds per machine: %v", used)
	for _, want := range []string{"tier 0", "tier 2", "machines", "plan " + rec.ID + "  built"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if !strings.Contains(logs.String(), "component=agent") {
		t.Errorf("no agent logged to the farm's log")
	}

	// Every process's /metrics: the controller's on the base port, agent i
	// on the port i above it, each printed in the banner.
	_, port, _ := splitAddr(metricsBase)
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
			if body = scrape(t, url); strings.Contains(body, want) || time.Now().After(deadline) {
				break
			}
		}
		if !strings.Contains(body, want) {
			t.Errorf("%s lacks %s:\n%s", url, want, grepLines(body, "meshbuild_"))
		}
	}

	stopped = true
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
// the registry; a plan builds across them; one that exits fails the farm;
// Stop stops them all.
func TestUpBuildkitdPerAgent(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, src := smallFleet(t, "base", "runtime", "tool-01", "tool-02")
	state := t.TempDir()
	logs := &syncWriter{w: &bytes.Buffer{}}
	var banner bytes.Buffer
	f, err := Up(context.Background(), UpOptions{
		Catalogue: catalogue, Agents: 2, StateDir: state,
		ListenNATS: "127.0.0.1:0", ListenRegistry: "127.0.0.1:0",
		BuildkitdBin:      buildkitdBin(t),
		BuildkitdPerAgent: true, MaxParallelism: 1,
		InsteadOf: DemoInsteadOf(state),
		Log:       slog.New(slog.NewTextHandler(logs, nil)),
		Out:       &banner,
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	defer func() {
		f.Stop()
		if t.Failed() {
			t.Logf("farm log:\n%s", logs.String())
		}
	}()

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
	if err := Demo(ctx, f, src, &out); err != nil {
		t.Fatalf("Demo: %v\n%s", err, out.String())
	}

	// A daemon that exits fails the farm, naming whose it was.
	if err := f.bks[1].Stop(); err != nil {
		t.Fatalf("stopping the second buildkitd: %v", err)
	}
	werr := make(chan error, 1)
	go func() { werr <- f.Wait() }()
	select {
	case err := <-werr:
		if err == nil || !strings.Contains(err.Error(), "the buildkitd of "+machines[1]+" exited") {
			t.Errorf("Wait = %v, want the buildkitd of %s exited", err, machines[1])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return when a buildkitd exited")
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

// A farm given no state directory makes one and removes it on Stop.
func TestUpTempState(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, _ := smallFleet(t, "base")
	f, err := Up(context.Background(), UpOptions{
		Catalogue: catalogue, ListenNATS: "127.0.0.1:0", ListenRegistry: "127.0.0.1:0",
		BuildkitdBin: buildkitdBin(t),
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	dir := f.StateDir()
	if _, err := os.Stat(filepath.Join(dir, "nats")); err != nil {
		t.Errorf("no NATS store in %s: %v", dir, err)
	}
	if err := f.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary state directory %s is still there: %v", dir, err)
	}
}

// freePorts returns a loopback address whose port and the n-1 ports after
// it are free.
func freePorts(t *testing.T, n int) string {
	t.Helper()
next:
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		for i := 1; i < n; i++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+i))
			if err != nil {
				continue next
			}
			l.Close()
		}
		return "127.0.0.1:" + strconv.Itoa(port)
	}
	t.Fatalf("no %d free ports in a row", n)
	return ""
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Errorf("scraping %s: %v", url, err)
		return ""
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("scraping %s: %s, %v", url, resp.Status, err)
	}
	return string(body)
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// syncWriter is a writer safe for the farm's goroutines and the test.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

func TestPrintPlan(t *testing.T) {
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := cascade.PlanRecord{
		ID: "p-0123456789ab", Summary: "push https://git.example/fleet.git@1a2b3c4 (refs/heads/main), changed base/motd",
		Outcome: cascade.OutcomeFailed, Counts: cascade.Counts{Built: 2, Failed: 1, Blocked: 1, Total: 4},
		Created: created, Finished: created.Add(75 * time.Second),
	}
	mods := map[string]cascade.ModuleStatus{
		"base":    {Module: "base", Tier: 0, State: cascade.Built, On: "m-a1", Duration: 2100 * time.Millisecond, Digest: "sha256:0123456789abcdef"},
		"runtime": {Module: "runtime", Tier: 1, State: cascade.Built, On: "m-a2", Duration: 3 * time.Second, Digest: "sha256:fedcba9876543210"},
		"tool-01": {Module: "tool-01", Tier: 2, State: cascade.Failed, On: "m-a1", Duration: time.Second,
			Reason: "build", Message: "RUN exit code: 3\nmore", Log: []string{"it broke"}},
		"tool-02": {Module: "tool-02", Tier: 3, State: cascade.Blocked, BlockedBy: "tool-01"},
	}
	var b bytes.Buffer
	PrintPlan(&b, rec, mods)
	want := `plan p-0123456789ab  failed  push https://git.example/fleet.git@1a2b3c4 (refs/heads/main), changed base/motd
  4 modules: 2 built, 1 failed, 1 blocked in 1m15s
tier 0
  base     built    m-a1  2.1s  0123456789ab
tier 1
  runtime  built    m-a2    3s  fedcba987654
tier 2
  tool-01  failed   m-a1    1s  build: RUN exit code: 3
tier 3
  tool-02  blocked  -        -  blocked by tool-01
tool-01 failed (build); its last log lines:
  | it broke
machines
  m-a1  1 built  2.1s
  m-a2  1 built  3s
`
	if b.String() != want {
		t.Errorf("PrintPlan:\n%s\nwant:\n%s", b.String(), want)
	}
	err := notBuilt(rec, mods)
	if !errors.Is(err, ErrPlanNotBuilt) || !strings.Contains(err.Error(), "tool-01 (build: RUN exit code: 3)") {
		t.Errorf("notBuilt = %v", err)
	}
}
