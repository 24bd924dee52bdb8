// Command benchtable runs meshbuild's benchmarks through the real parts and
// prints one table: every figure beside what it is measured against in the
// same run, its target, whether it meets it, and the command that
// reproduces it.
//
// Each benchmark runs in its own `go test -run XXX -bench <name> -benchtime
// 1x ./<pkg>` with MESHBUILD_BUILDKIT=1 (the BuildKit benchmark starts
// bin/buildkitd and a registry; `make deps` builds the binaries); the
// figures are the metrics the benchmarks report with b.ReportMetric.
//
//	go run ./cmd/benchtable                  # what `make bench` runs
//	go run ./cmd/benchtable -only Dispatch   # the rows of one benchmark
//	go run ./cmd/benchtable -v               # stream go test's output
//
// The table is Markdown, as BENCHMARKS.md keeps it. The exit status is 1
// when a benchmark could not run, and with -strict also when a figure
// misses its target.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// suite is one `go test` run: a top-level benchmark, optionally narrowed
// to some of its sub-benchmarks.
type suite struct {
	pkg   string
	bench string
	// sub is the -bench pattern of the sub-benchmarks; empty runs all.
	sub string
}

func (s suite) pattern() string {
	p := "^" + s.bench + "$"
	if s.sub != "" {
		p += "/" + s.sub
	}
	return p
}

// command is how to run benchmarks matching pattern in the suite's package.
func command(pkg, pattern string) []string {
	return []string{"go", "test", "-run", "XXX", "-bench", pattern, "-benchtime", "1x", "-timeout", "20m", pkg}
}

func shell(args []string) string {
	out := []string{"MESHBUILD_BUILDKIT=1"}
	for _, a := range args {
		if strings.ContainsAny(a, "^$|()*? ") {
			a = "'" + a + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// metrics are one benchmark's reported figures by unit.
type metrics map[string]float64

// results are every benchmark's metrics by full name (Benchmark…/sub).
type results map[string]metrics

// row is one line of the table.
type row struct {
	figure string
	suite  suite
	// bench is the full benchmark name; metric the unit of the figure.
	bench, metric string
	// format prints the figure and the figures beside it.
	format string
	// beside describes what was measured beside the figure, in the same
	// run.
	beside func(m metrics) string
	// atMost or atLeast is the target.
	atMost, atLeast float64
	// best, if set, is the metric of the best figure possible (the ideal
	// schedule): a missed target it misses too is said so.
	best string
	// none is the text of a row not measured.
	none string
}

func (r row) target() string {
	switch {
	case r.atMost > 0:
		return "≤ " + strconv.FormatFloat(r.atMost, 'f', -1, 64) + r.unitSuffix()
	case r.atLeast > 0:
		return "≥ " + strconv.FormatFloat(r.atLeast, 'f', -1, 64) + r.unitSuffix()
	}
	return "—"
}

func (r row) unitSuffix() string {
	switch {
	case strings.HasSuffix(r.metric, "-ms"):
		return " ms"
	case strings.HasSuffix(r.metric, "/s"):
		return "/s"
	}
	return ""
}

func (r row) meets(v float64) bool {
	switch {
	case r.atMost > 0:
		return v <= r.atMost
	case r.atLeast > 0:
		return v >= r.atLeast
	}
	return true
}

// reproduce is the command that runs the row's benchmark alone.
func (r row) reproduce() string {
	if r.bench == "" {
		return "—"
	}
	levels := strings.Split(r.bench, "/")
	for i, l := range levels {
		levels[i] = "^" + regexp.QuoteMeta(l) + "$"
	}
	return "`" + shell(command(r.suite.pkg, strings.Join(levels, "/"))) + "`"
}

var (
	fan   = suite{pkg: "./cascade", bench: "BenchmarkControllerFan35On4", sub: "^(equal|lognormal|lognormal-learned|lognormal-window-0)$"}
	dag   = suite{pkg: "./cascade", bench: "BenchmarkControllerDAG1000On50", sub: "^(idle|idle-learned|window-0)$"}
	thru  = suite{pkg: "./cascade", bench: "BenchmarkControllerThroughput10000"}
	disp  = suite{pkg: "./agent", bench: "BenchmarkDispatch"}
	over  = suite{pkg: "./agent", bench: "BenchmarkAgentOverhead"}
	fleet = suite{pkg: "./internal/demo", bench: "BenchmarkFleetSpeedup"}

	suites = []suite{fan, dag, thru, disp, over, fleet}
)

// schedule is what a scheduling row shows beside its figure: the pure
// simulator on the same DAG and durations, and the time the real run took
// beyond the simulated schedule of the controller's policy.
func schedule(m metrics) string {
	return fmt.Sprintf("tier barrier (sim) %.3f · controller's policy (sim) %.3f · best schedule (sim) %.3f · real run %.1f s, %+.0f ms on the simulated policy",
		m["sim-barrier-makespan/lb"], m["sim-cascade-makespan/lb"], m["sim-ideal-makespan/lb"], m["makespan-s"], m["over-sim-ms"])
}

func buildkit(kind string) func(m metrics) string {
	return func(m metrics) string {
		a, d, in := m[kind+"-agent-ms"], m[kind+"-direct-ms"], m[kind+"-agent-in-buildkit-ms"]
		return fmt.Sprintf("medians of 15 pairs: agent %.0f ms, of it %.0f ms outside BuildKit.Build (bus, git checkout, events); buildctl %.0f ms", a, a-in, d)
	}
}

// fleetSpeedup is what the fleet's row on k machines shows beside its
// figure: both runs, the best the DAG allows with the one-machine build
// times, and the builds' own slow-down.
func fleetSpeedup(k int) func(m metrics) string {
	return func(m metrics) string {
		return fmt.Sprintf("one machine %.1f s, %d machines %.1f s: speed-up %.2f · best possible for this DAG with the one-machine build times (sim) %.3f, controller's policy (sim) %.3f · mean build %.2f s on one machine, %.2f s on %d · real run %+.2f s on the simulated policy with its own build times",
			m["one-machine-s"], k, m["makespan-s"], m["speedup"], m["ideal-speedup/K"], m["sim-cascade-speedup/K"], m["one-build-s"], m["build-s"], k, m["over-sim-s"])
	}
}

var rows = []row{
	{figure: "cascade, fan 35 on 4, equal durations, default config: makespan ÷ lower bound", suite: fan,
		bench: "BenchmarkControllerFan35On4/equal", metric: "makespan/lb", format: "%.3f", beside: schedule,
		atMost: 1.05, best: "sim-ideal-makespan/lb"},
	{figure: "cascade, fan 35 on 4, lognormal (3 seeds), default config, first sight", suite: fan,
		bench: "BenchmarkControllerFan35On4/lognormal", metric: "makespan/lb", format: "%.3f", beside: schedule,
		atMost: 1.05, best: "sim-ideal-makespan/lb"},
	{figure: "cascade, fan 35 on 4, lognormal (3 seeds), default config, durations learned from a first run", suite: fan,
		bench: "BenchmarkControllerFan35On4/lognormal-learned", metric: "makespan/lb", format: "%.3f", beside: schedule,
		atMost: 1.05, best: "sim-ideal-makespan/lb"},
	{figure: "cascade, fan 35 on 4, lognormal (3 seeds), --window 0 (every ask at once)", suite: fan,
		bench: "BenchmarkControllerFan35On4/lognormal-window-0", metric: "makespan/lb", format: "%.3f", beside: schedule,
		atMost: 1.05, best: "sim-ideal-makespan/lb"},
	{figure: "cascade, 1,000-module DAG on 50, default config, first sight", suite: dag,
		bench: "BenchmarkControllerDAG1000On50/idle", metric: "makespan/lb", format: "%.3f", beside: schedule,
		atMost: 1.05, best: "sim-ideal-makespan/lb"},
	{figure: "cascade, 1,000-module DAG on 50, default config, durations learned from a first run", suite: dag,
		bench: "BenchmarkControllerDAG1000On50/idle-learned", metric: "makespan/lb", format: "%.3f", beside: schedule,
		atMost: 1.05, best: "sim-ideal-makespan/lb"},
	{figure: "cascade, 1,000-module DAG on 50, --window 0 (every ask at once)", suite: dag,
		bench: "BenchmarkControllerDAG1000On50/window-0", metric: "makespan/lb", format: "%.3f", beside: schedule,
		atMost: 1.05, best: "sim-ideal-makespan/lb"},
	{figure: "controller throughput, 10,000 modules on 200 slots (20 agents × 10), zero-length builds, default config", suite: thru,
		bench: "BenchmarkControllerThroughput10000/default", metric: "modules/s", format: "%.0f",
		beside: func(m metrics) string {
			return fmt.Sprintf("median of 3 plans; slowest %.0f/s; first ask started %.0f ms after the push", m["slowest-modules/s"], m["first-start-ms"])
		},
		atLeast: 2000},
	{figure: "controller throughput, as above, --window 0", suite: thru,
		bench: "BenchmarkControllerThroughput10000/window-0", metric: "modules/s", format: "%.0f",
		beside: func(m metrics) string {
			return fmt.Sprintf("median of 3 plans; slowest %.0f/s; first ask started %.0f ms after the push", m["slowest-modules/s"], m["first-start-ms"])
		},
		atLeast: 2000},
	{figure: "dispatch, ask published → started, idle agents: p50", suite: disp,
		bench: "BenchmarkDispatch", metric: "p50-ms", format: "%.2f",
		beside: func(m metrics) string {
			return fmt.Sprintf("200 asks, 4 idle agents; p99 %.2f ms, max %.2f ms", m["p99-ms"], m["max-ms"])
		},
		atMost: 5},
	{figure: "dispatch, ask published → started, idle agents: p99", suite: disp,
		bench: "BenchmarkDispatch", metric: "p99-ms", format: "%.2f",
		beside: func(m metrics) string {
			return fmt.Sprintf("200 asks, 4 idle agents; p50 %.2f ms, max %.2f ms", m["p50-ms"], m["max-ms"])
		},
		atMost: 25},
	{figure: "agent ÷ buildctl alone, same Dockerfile and daemon, warm cache", suite: over,
		bench: "BenchmarkAgentOverhead", metric: "warm-agent/direct", format: "%.3f", beside: buildkit("warm"),
		atMost: 1.05},
	{figure: "agent ÷ buildctl alone, same Dockerfile and daemon, cold build cache (pruned before each build; same commit)", suite: over,
		bench: "BenchmarkAgentOverhead", metric: "pruned-agent/direct", format: "%.3f", beside: buildkit("pruned"),
		atMost: 1.05},
	{figure: "agent ÷ buildctl alone, same Dockerfile and daemon, a new commit each build (agent: git fetch; COPY and RUN miss)", suite: over,
		bench: "BenchmarkAgentOverhead", metric: "cold-agent/direct", format: "%.3f", beside: buildkit("cold"),
		atMost: 1.05},
	{figure: "fleet speed-up ÷ K, K = 2: examples/fleet (39 modules, each + 1 s sleep) on 2 buildkitds of max-parallelism 1 vs one", suite: fleet,
		bench: "BenchmarkFleetSpeedup/K=2", metric: "speedup/K", format: "%.3f", beside: fleetSpeedup(2),
		best: "ideal-speedup/K"},
	{figure: "fleet speed-up ÷ K, K = 4: examples/fleet (39 modules, each + 1 s sleep) on 4 buildkitds of max-parallelism 1 vs one", suite: fleet,
		bench: "BenchmarkFleetSpeedup/K=4", metric: "speedup/K", format: "%.3f", beside: fleetSpeedup(4),
		best: "ideal-speedup/K"},
}

func main() {
	only := flag.String("only", "", "run only the rows whose benchmark matches this regexp")
	verbose := flag.Bool("v", false, "stream go test's output to stderr")
	strict := flag.Bool("strict", false, "exit 1 when a figure misses its target")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, *only, *verbose, *strict, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, only string, verbose, strict bool, stdout, stderr io.Writer) int {
	filter, err := regexp.Compile(only)
	if err != nil {
		fmt.Fprintf(stderr, "benchtable: -only %q: %v\n", only, err)
		return 2
	}
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintf(stderr, "benchtable: %v\n", err)
		return 2
	}
	var selected []row
	want := map[suite]bool{}
	for _, r := range rows {
		if r.bench == "" && only == "" || r.bench != "" && filter.MatchString(r.bench) {
			selected = append(selected, r)
			if r.bench != "" {
				want[r.suite] = true
			}
		}
	}

	res := results{}
	failed := map[suite]string{}
	began := time.Now()
	n := 0
	for _, s := range suites {
		if !want[s] {
			continue
		}
		n++
		args := command(s.pkg, s.pattern())
		fmt.Fprintf(stderr, "benchtable: [%d/%d] %s\n", n, len(want), shell(args))
		t0 := time.Now()
		out, err := goTest(ctx, root, args, verbose, stderr)
		parse(out, res)
		if err != nil {
			failed[s] = err.Error()
			fmt.Fprintf(stderr, "benchtable: %s failed: %v\n%s\n", s.bench, err, tail(out, 30))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		fmt.Fprintf(stderr, "benchtable: %s done in %s\n", s.bench, time.Since(t0).Round(time.Second))
	}

	code := 0
	fmt.Fprintln(stdout, "| figure | measured | side by side, same run | target | result | reproduce |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|")
	for _, r := range selected {
		measured, beside, result := "—", "", r.none
		if r.bench != "" {
			m, ok := res[r.bench]
			v, have := m[r.metric]
			switch {
			case !have && failed[r.suite] != "":
				result = "ERROR: " + failed[r.suite]
				code = 1
			case !ok || !have:
				result = "ERROR: no " + r.metric + " reported"
				code = 1
			default:
				measured = fmt.Sprintf(r.format, v) + r.unitSuffix()
				if r.beside != nil {
					beside = r.beside(m)
				}
				if b, ok := m[r.best]; ok && r.best != "" && r.atMost == 0 && r.atLeast == 0 {
					result = fmt.Sprintf("no target; %.0f %% of the best possible", 100*v/b)
				} else if r.meets(v) {
					result = "pass"
				} else {
					result = "FAIL"
					if b, ok := m[r.best]; ok && r.best != "" && !r.meets(b) {
						result += fmt.Sprintf(" (the bound is out of reach here: the best schedule is %.3f)", b)
					}
					if strict {
						code = 1
					}
				}
			}
		}
		fmt.Fprintf(stdout, "| %s | %s | %s | %s | %s | %s |\n", r.figure, measured, beside, r.target(), result, r.reproduce())
	}
	fmt.Fprintf(stdout, "\n%s; %s.\n", machine(ctx, root), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(stderr, "benchtable: %s in all\n", time.Since(began).Round(time.Second))
	return code
}

// goTest runs go test in dir with MESHBUILD_BUILDKIT=1 and returns its
// output.
func goTest(ctx context.Context, dir string, args []string, verbose bool, stderr io.Writer) ([]byte, error) {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MESHBUILD_BUILDKIT=1")
	var out bytes.Buffer
	if verbose {
		cmd.Stdout = io.MultiWriter(&out, stderr)
	} else {
		cmd.Stdout = &out
	}
	cmd.Stderr = cmd.Stdout
	err := cmd.Run()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("go test exited %d", exit.ExitCode())
		}
	}
	return out.Bytes(), err
}

// parse reads benchmark result lines:
//
//	BenchmarkX/sub-2   1   123 ns/op   1.02 makespan/lb   …
func parse(out []byte, res results) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		// go test runs with the GOMAXPROCS this process has, and names a
		// benchmark Name-N unless it is 1.
		name := f[0]
		if p := runtime.GOMAXPROCS(0); p > 1 {
			name = strings.TrimSuffix(name, "-"+strconv.Itoa(p))
		}
		m := metrics{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			m[f[i+1]] = v
		}
		res[name] = m
	}
}

func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// repoRoot is the directory of the module's go.mod, above the working
// directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module github.com/meshbuild/meshbuild\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the meshbuild module: run it from the repository")
		}
		dir = parent
	}
}

// machine describes where the table was measured.
func machine(ctx context.Context, root string) string {
	parts := []string{fmt.Sprintf("%d CPUs", runtime.NumCPU())}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				parts[0] += " (" + strings.TrimSpace(v) + ")"
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				if kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64); err == nil {
					parts = append(parts, fmt.Sprintf("%.0f GiB", kb/(1<<20)))
				}
			}
		}
	}
	cmd := exec.CommandContext(ctx, "go", "env", "GOVERSION")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		parts = append(parts, strings.TrimSpace(string(out)))
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		parts = append(parts, runtime.GOOS+" "+strings.TrimSpace(string(data)))
	}
	return "Measured on " + strings.Join(parts, ", ")
}
