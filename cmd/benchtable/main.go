// Command benchtable runs meshbuild's benchmarks through the real parts and
// prints one table: every figure beside what it is measured against in the
// same run, its target, whether it meets it, and the command that
// reproduces it. With -o and -json it writes BENCHMARKS.md — the table and
// prose whose every figure is a reference to the run (benchmarks.md.tmpl)
// — and the run's figures, BENCHMARKS.json, from which -render writes the
// document again.
//
// Each benchmark runs in its own `go test -run XXX -bench <name> -benchtime
// 1x ./<pkg>` with MESHBUILD_BUILDKIT=1 (the BuildKit benchmark starts
// bin/buildkitd and a registry; `make deps` builds the binaries); the
// figures are the metrics the benchmarks report with b.ReportMetric.
//
//	go run ./cmd/benchtable -o BENCHMARKS.md -json BENCHMARKS.json  # make bench
//	go run ./cmd/benchtable                  # the table only
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
	"cmp"
	"context"
	"encoding/json"
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
	"slices"
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
	// timeout is go test's -timeout; 0 is defaultTimeout.
	timeout time.Duration
}

// defaultTimeout is a suite's go test -timeout unless it sets its own.
const defaultTimeout = 20 * time.Minute

func (s suite) pattern() string {
	p := "^" + s.bench + "$"
	if s.sub != "" {
		p += "/" + s.sub
	}
	return p
}

// command is how to run benchmarks matching pattern in the suite's package.
func command(s suite, pattern string) []string {
	timeout := cmp.Or(s.timeout, defaultTimeout)
	return []string{"go", "test", "-run", "XXX", "-bench", pattern, "-benchtime", "1x", "-timeout", strings.TrimSuffix(timeout.String(), "0s"), s.pkg}
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
	// best, if set, is the metric of a figure to compare with: for a row
	// with a target, the list schedule (a missed target it misses too is
	// said so); without one, the bound (the figure's share of it is said).
	best string
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
	case strings.HasSuffix(r.metric, "-s"):
		return " s"
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
	return "`" + shell(command(r.suite, strings.Join(levels, "/"))) + "`"
}

var (
	fan = suite{pkg: "./cascade", bench: "BenchmarkControllerFan35On4", sub: "^(equal|lognormal|lognormal-learned|lognormal-window-0)$"}
	dag = suite{pkg: "./cascade", bench: "BenchmarkControllerDAG1000On50", sub: "^(idle|idle-learned|window-0)$"}
	opt = suite{pkg: "./cascade/sim", bench: "BenchmarkListVersusOptimal"}
	// first is BenchmarkFirstSight: estimates of durations not known,
	// measured in the simulator on the scheduling benchmarks' DAGs.
	first = suite{pkg: "./cascade/sim", bench: "BenchmarkFirstSight"}
	thru  = suite{pkg: "./cascade", bench: "BenchmarkControllerThroughput10000"}
	disp  = suite{pkg: "./agent", bench: "BenchmarkDispatch"}
	over  = suite{pkg: "./agent", bench: "BenchmarkAgentOverhead"}
	fleet = suite{pkg: "./cmd/internal/demo", bench: "BenchmarkFleetSpeedup"}
	rebld = suite{pkg: "./cmd/internal/demo", bench: "BenchmarkFleetRebuild"}
	// bake is BenchmarkFleetBake: the farm against buildx bake on a fleet
	// whose steps sleep.
	bake = suite{pkg: "./cmd/internal/demo", bench: "BenchmarkFleetBake"}
	// overFleet is BenchmarkAgentOverheadFleet: the fully cached build on
	// three machines at once.
	overFleet = suite{pkg: "./agent", bench: "BenchmarkAgentOverheadFleet"}
	// thousand is BenchmarkFleet1000: 50 and 1,000 simulated machines on
	// one server and on a cluster of three, and 10,000 on one server, the
	// server in its own process; its five runs take longer than the other
	// suites.
	thousand = suite{pkg: "./cascade", bench: "BenchmarkFleet1000", timeout: 90 * time.Minute}
	// sched is BenchmarkScheduling: priority, fair share and the
	// scheduler's own cost across plans.
	sched = suite{pkg: "./cascade", bench: "BenchmarkScheduling"}
	// failover is BenchmarkFailover: what a lost machine costs.
	failover = suite{pkg: "./agent", bench: "BenchmarkFailover"}
	// layers is BenchmarkLayerCompression: an image's own layer of tens
	// of megabytes, gzip against zstd.
	layers = suite{pkg: "./agent", bench: "BenchmarkLayerCompression"}

	suites = []suite{fan, dag, opt, first, thru, disp, over, overFleet, layers, fleet, rebld, bake, thousand, sched, failover}
)

// layerRow is what a BenchmarkLayerCompression row shows beside its
// figure: where the cached build's time goes, the cold build, the image.
func layerRow(c string) func(metrics) string {
	return func(m metrics) string {
		return fmt.Sprintf("each at a new commit of the same tree (exported: the index names the commit); the layer %.1f MB uncompressed; the cached build's export %.0f ms (BuildKit's rewrite-timestamp uncompresses and compresses every own layer again on every export); the cold build %.0f ms, its export %.0f ms; the image %.1f MB; the cold build's ask again, answered with what it pushed, not exported: %.0f ms",
			m["layer-uncompressed-MB"], m[c+"-cached-export-ms"], m[c+"-cold-ms"], m[c+"-cold-export-ms"], m[c+"-image-MB"], m[c+"-reused-ms"])
	}
}

// schedule is what a scheduling row shows beside its figure: the pure
// simulator on the same DAG and durations, and the time the real run took
// beyond the simulated schedule of the controller's policy.
func schedule(m metrics) string {
	return fmt.Sprintf("tier barrier (sim) %.3f · controller's policy (sim) %.3f · list scheduling, longest path first, by the true durations (sim; a heuristic) %.3f · real run %.1f s, %+.0f ms on the simulated policy",
		m["sim-barrier-makespan/lb"], m["sim-cascade-makespan/lb"], m["sim-list-makespan/lb"], m["makespan-s"], m["over-sim-ms"])
}

// firstSight is what a first-sight row (durations unknown to the
// controller, its asks ranked by path length in modules) shows beside its
// figure: the same makespan over the lower bound, the simulator's model of
// the controller's policy over the same list schedule — what the ranking
// alone costs — and the schedule row's figures.
func firstSight(m metrics) string {
	return fmt.Sprintf("÷ lower bound %.3f · controller's policy (sim) ÷ list scheduling %.3f · ", m["makespan/lb"], m["sim-cascade-makespan/list"]) + schedule(m)
}

// firstSightRow is BenchmarkFirstSight's row for one set of DAGs: the
// controller's estimate at first sight (path length in modules; the mean
// of the known durations for a module not known) against the other
// estimators, nothing known and one module in ten never built.
func firstSightRow(dags, sub string) row {
	return row{figure: "first sight (sim), " + dags + ", the controller's policy ranked by module count (the controller's first-sight estimate) and aged by the time waited ÷ list scheduling with the true durations", suite: first,
		bench: "BenchmarkFirstSight/" + sub, metric: "nothing-unit/list", format: "%.3f",
		beside: func(m metrics) string {
			return fmt.Sprintf("not aged %.3f · ranked instead by the expected remaining critical path under a lognormal prior %.3f · one module in ten never built, the others known, it counted as: the mean of the known durations (the controller's) %.3f, its siblings' median %.3f, its bases' mean %.3f, the expected path %.3f",
				m["nothing-unit-unaged/list"], m["nothing-expected-path/list"], m["tenth-unit/list"], m["tenth-sibling/list"], m["tenth-base/list"], m["tenth-expected-path/list"])
		}}
}

// bakeRow is one of BenchmarkFleetBake's rows: what it measures, its
// metric and its target atMost.
func bakeRow(what, metric string, atMost float64, beside func(metrics) string) row {
	return row{figure: "the farm against `buildx bake`, a fleet of 16 modules four levels deep whose RUN steps sleep, 3 machines of one slot (each its own buildkitd) against bake on one buildkitd of 3: " + what, suite: bake,
		bench: "BenchmarkFleetBake", metric: metric, format: "%.3f",
		beside: func(m metrics) string {
			return beside(m) + fmt.Sprintf("; buildx %s, remote driver, the same registry", buildxVersion)
		},
		atMost: atMost}
}

// own is what an agent-overhead row shows beside the agent's own time.
func own(kind string) func(m metrics) string {
	return func(m metrics) string {
		return fmt.Sprintf("medians of %.0f asks: events %.1f ms, checkout %.1f ms, ping %.1f ms, verify %.1f ms · the build in all %.0f ms through the agent, %.0f ms through buildctl (median ratio %.3f; buildctl starts a process and a session each build)",
			m["pairs"], m[kind+"-events-ms"], m[kind+"-checkout-ms"], m[kind+"-ping-ms"], m[kind+"-verify-ms"], m[kind+"-agent-ms"], m[kind+"-direct-ms"], m[kind+"-agent/direct"])
	}
}

// cachedSplit is what a fully cached build's row shows beside its figure:
// where the time went, medians of the kind's builds.
func cachedSplit(kind string) func(m metrics) string {
	return func(m metrics) string {
		return fmt.Sprintf("p90 %.0f ms; medians of %.0f builds: events %.1f ms, checkout %.1f ms, ping %.1f ms, solve %.1f ms (cache import %.1f ms, export and push of the image and its attestations %.1f ms, cache export %.1f ms, the rest — frontend, transfers, cache lookups%s — %.1f ms), verify %.1f ms%s",
			m[kind+"-p90-ms"], m["cached-builds"], m[kind+"-events-ms"], m[kind+"-checkout-ms"], m[kind+"-ping-ms"], m[kind+"-solve-ms"],
			m[kind+"-cache-import-ms"], m[kind+"-export-ms"], m[kind+"-cache-export-ms"], map[bool]string{true: ", the history record"}[kind == "cached-history"],
			m[kind+"-solve-other-ms"], m[kind+"-verify-ms"],
			map[bool]string{true: fmt.Sprintf(" (verified as before: %.1f ms)", m["cached-verify-before-ms"])}[kind == "cached"])
	}
}

// fleetSpeedup is what the fleet's row on k machines shows beside its
// figure: both runs, what the DAG allows with the one-machine build times,
// and the builds' own slow-down.
func fleetSpeedup(k int) func(m metrics) string {
	return func(m metrics) string {
		return fmt.Sprintf("one machine %.1f s, %d machines %.1f s: speed-up %.2f · with the one-machine build times: list scheduling (sim; a heuristic) %.3f, the bound no schedule beats %.3f, controller's policy (sim) %.3f · mean build %.2f s on one machine, %.2f s on %d · real run %+.2f s on the simulated policy with its own build times",
			m["one-machine-s"], k, m["makespan-s"], m["speedup"], m["list-speedup/K"], m["bound-speedup/K"], m["sim-cascade-speedup/K"], m["one-build-s"], m["build-s"], k, m["over-sim-s"])
	}
}

// buildxVersion is the buildx BenchmarkFleetRebuild bakes with
// (cmd/internal/demo, BuildxVersion).
const buildxVersion = "v0.38.2"

// fleetBus names BenchmarkFleet1000's buses in the rows' figures.
var fleetBus = map[string]string{"single": "one server", "cluster3": "a three-node cluster (R3, sync always)"}

// fleetRows are BenchmarkFleet1000's rows for one bus ("single" or
// "cluster3"): dispatch and throughput at 50, at 1,000 and (one server)
// at 10,000 machines side by side, then the makespan at 1,000 and the
// server's memory at 1,000 and 10,000.
func fleetRows(bus string) []row {
	name := func(agents int) string { return fmt.Sprintf("BenchmarkFleet1000/%s/agents=%d", bus, agents) }
	on := fleetBus[bus]
	// A fleet beyond mesh.ShardAbove has its seat's queue in shards.
	sharded := func(m metrics) string {
		if m["shards"] > 1 {
			return fmt.Sprintf("the queue in %.0f shards (mesh.FleetSettingsOf); ", m["shards"])
		}
		return ""
	}
	dispatch := func(m metrics) string {
		return fmt.Sprintf("%s%.0f asks to idle agents, one connection each; p50 %.2f ms, max %.2f ms", sharded(m), m["asks"], m["p50-ms"], m["max-ms"])
	}
	throughput := func(m metrics) string {
		// Between the nodes: forwarded client messages and JetStream's
		// replication (runs saved before it was measured have none).
		routes := ""
		if r, ok := m["server-route-in-msgs/module"]; ok && bus == "cluster3" {
			routes = fmt.Sprintf("%.1f of them between the nodes; ", r)
		}
		return sharded(m) + fmt.Sprintf("median of %s; slowest %.0f/s · per module: server CPU %.3f ms, this process's CPU (controller and every agent) %.3f ms, %.1f messages into the server (%s%.2f JetStream API requests)%s · server peak RSS %.0f MiB",
			map[string]string{"single": "3 plans", "cluster3": "1 plan"}[bus], m["slowest-modules/s"], m["server-cpu-ms/module"], m["bench-cpu-ms/module"], m["server-in-msgs/module"], routes, m["server-js-api/module"], cpuCeiling(m), m["server-rss-MiB"])
	}
	// The cluster's targets are issue 23's for R3 with sync: always on
	// this machine (every write replicated and synced on three nodes).
	p99, rate := 5.0, 2000.0
	if bus == "cluster3" {
		p99, rate = 10, 1500
	}
	sizes := []int{50, 1000}
	if bus == "single" {
		sizes = append(sizes, 10000) // issue #23: 10,000 machines on one server
	}
	var out []row
	for _, agents := range sizes {
		out = append(out, row{figure: fmt.Sprintf("dispatch p99, ask published → claimed by a machine, %d machines on one seat, %s", agents, on), suite: thousand,
			bench: name(agents), metric: "p99-ms", format: "%.2f", beside: dispatch, atMost: p99})
	}
	for _, agents := range sizes {
		out = append(out, row{figure: fmt.Sprintf("controller throughput, 10,000 modules, zero-length builds, %d machines, %s", agents, on), suite: thousand,
			bench: name(agents), metric: "modules/s", format: "%.0f", beside: throughput, atLeast: rate})
	}
	out = append(out,
		row{figure: "makespan ÷ bound, 10,000 modules (lognormal, durations learned), 1,000 machines, " + on, suite: thousand,
			bench: name(1000), metric: "makespan/lb", format: "%.3f", atMost: 1.05,
			beside: func(m metrics) string {
				if m["makespan-runs"] > 1 {
					return fmt.Sprintf("median of %.0f runs, each a new plan on the same farm: %.1f s against a bound of %.1f s (1 unit = 400 ms); fastest %.3f, slowest %.3f",
						m["makespan-runs"], m["makespan-s"], m["lb-s"], m["makespan-min/lb"], m["makespan-max/lb"])
				}
				return fmt.Sprintf("%.1f s against a bound of %.1f s (1 unit = 400 ms)", m["makespan-s"], m["lb-s"])
			}},
	)
	if bus == "single" {
		out = append(out, row{figure: "builds in hand: the server's CPU for each, beside plan progress (its ask claim renewed every third of the claim's lease, its heartbeat every third of the ack wait), 10,000 machines, one server (µs a second)", suite: thousand,
			bench: name(10000), metric: "busy-server-us-per-build", format: "%.0f",
			beside: func(m metrics) string {
				return fmt.Sprintf("%.0f builds of 20 s in hand, measured over 5 s against the fleet idle: %.2f messages a second into the server for each; the server %.3f cores with them in hand, %.3f idle; at that rate 10,000 builds in hand take %.2f cores of the server (seat claims, renewed every 5 s by each machine, not included)",
					m["busy-builds"], m["busy-server-msgs-per-build"], m["busy-server-cores"], m["idle-server-cores"], m["busy-10000-server-cores"])
			}})
	}
	for _, agents := range sizes[1:] {
		out = append(out, row{figure: fmt.Sprintf("server memory, peak resident set, %s machines, %s (MiB)", thousands(agents), on), suite: thousand,
			bench: name(agents), metric: "server-rss-MiB", format: "%.0f",
			beside: func(m metrics) string {
				s := fmt.Sprintf("the largest node's peak over the whole run; fetch errors logged by the agents: %.0f", m["fetch-errors"])
				if d, ok := m["server-api-dropped"]; ok {
					s += fmt.Sprintf("; JetStream API requests the server dropped, its queue full: %.0f (its request_queue_limit mesh.FleetSettingsOf's); every machine started and pulling %.1f s after they began", d, m["fleet-ready-s"])
				}
				return s
			}})
	}
	return out
}

// thousands writes n with a comma between thousands, as the figures do.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// learned is how the learned rows are run.
const learned = "durations learned from a first run, re-run with each build taking a seeded lognormal factor (σ 0.18: two thirds within ±20 %) of what it took"

var rows = []row{
	{figure: "cascade, fan 35 on 4, equal durations, default config: makespan ÷ list scheduling with the true durations", suite: fan,
		bench: "BenchmarkControllerFan35On4/equal", metric: "makespan/list", format: "%.3f", beside: firstSight,
		atMost: 1.05},
	{figure: "cascade, fan 35 on 4, lognormal (3 seeds), default config, first sight: makespan ÷ list scheduling with the true durations", suite: fan,
		bench: "BenchmarkControllerFan35On4/lognormal", metric: "makespan/list", format: "%.3f", beside: firstSight,
		atMost: 1.05},
	{figure: "cascade, fan 35 on 4, lognormal (3 seeds), default config, " + learned, suite: fan,
		bench: "BenchmarkControllerFan35On4/lognormal-learned", metric: "makespan/lb", format: "%.3f", beside: schedule,
		atMost: 1.05, best: "sim-list-makespan/lb"},
	{figure: "cascade, fan 35 on 4, lognormal (3 seeds), --window 0 (every ask at once), first sight: makespan ÷ list scheduling with the true durations", suite: fan,
		bench: "BenchmarkControllerFan35On4/lognormal-window-0", metric: "makespan/list", format: "%.3f", beside: firstSight,
		atMost: 1.05},
	{figure: "cascade, 1,000-module DAG on 50, default config, first sight: makespan ÷ list scheduling with the true durations", suite: dag,
		bench: "BenchmarkControllerDAG1000On50/idle", metric: "makespan/list", format: "%.3f", beside: firstSight,
		atMost: 1.05},
	{figure: "cascade, 1,000-module DAG on 50, default config, " + learned, suite: dag,
		bench: "BenchmarkControllerDAG1000On50/idle-learned", metric: "makespan/lb", format: "%.3f", beside: schedule,
		atMost: 1.05, best: "sim-list-makespan/lb"},
	{figure: "cascade, 1,000-module DAG on 50, --window 0 (every ask at once), first sight: makespan ÷ list scheduling with the true durations", suite: dag,
		bench: "BenchmarkControllerDAG1000On50/window-0", metric: "makespan/list", format: "%.3f", beside: firstSight,
		atMost: 1.05},
	firstSightRow("the fan of 35 on 4 (3 seeds)", "fan35on4"),
	firstSightRow("the 1,000-module DAG on 50 (seed 1, as above)", "dag1000on50-seed1"),
	firstSightRow("1,000-module DAGs on 50 (seeds 0-9)", "dag1000on50-10seeds"),
	{figure: "list scheduling, longest path first ÷ the exact optimum (sim.Optimal), 100 random 10-module DAGs on 2, 3 and 4 machines: the worst case", suite: opt,
		bench: "BenchmarkListVersusOptimal", metric: "worst-list/optimal", format: "%.3f",
		beside: func(m metrics) string {
			return fmt.Sprintf("mean %.4f; above the optimum in %.0f of %.0f cases", m["list/optimal"], m["above-optimal"], m["cases"])
		}},
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
	{figure: "dispatch, ask published → claimed by a machine, idle agents: p50", suite: disp,
		bench: "BenchmarkDispatch", metric: "p50-ms", format: "%.2f",
		beside: func(m metrics) string {
			return fmt.Sprintf("200 asks, 4 idle agents; p99 %.2f ms, max %.2f ms", m["p99-ms"], m["max-ms"])
		},
		atMost: 5},
	{figure: "dispatch, ask published → claimed by a machine, idle agents: p99", suite: disp,
		bench: "BenchmarkDispatch", metric: "p99-ms", format: "%.2f",
		beside: func(m metrics) string {
			return fmt.Sprintf("200 asks, 4 idle agents; p50 %.2f ms, max %.2f ms", m["p50-ms"], m["max-ms"])
		},
		atMost: 25},
	{figure: "the agent's own time per ask, outside BuildKit (the bus, the checkout, ping, verify): warm cache, same commit", suite: over,
		bench: "BenchmarkAgentOverhead", metric: "warm-own-ms", format: "%.1f", beside: own("warm")},
	{figure: "the agent's own time per ask, outside BuildKit: a new commit each build (git fetch; COPY and RUN miss)", suite: over,
		bench: "BenchmarkAgentOverhead", metric: "cold-own-ms", format: "%.1f", beside: own("cold")},
	{figure: "the agent's own time per ask, outside BuildKit: cold build cache (pruned before each build; same commit)", suite: over,
		bench: "BenchmarkAgentOverhead", metric: "pruned-own-ms", format: "%.1f", beside: own("pruned")},
	{figure: "a fully cached build's cost on its machine: ask published → built, every step cached, registry cache imported, and exported unless the registry holds its input key's already (the ask as the controller makes it, its key and commit the same each time, as a forced rebuild's: answered with what the first build pushed, verified, not pushed again): p50", suite: over,
		bench: "BenchmarkAgentOverhead", metric: "cached-p50-ms", format: "%.1f", beside: cachedSplit("cached"), atMost: 100},
	{figure: "the same, before: every solve recorded in buildkitd's history (BuildKitOptions.History), in turn with the above: p50", suite: over,
		bench: "BenchmarkAgentOverhead", metric: "cached-history-p50-ms", format: "%.1f", beside: cachedSplit("cached-history")},
	{figure: "a fully cached build's cost with three machines building at once (each its own buildkitd, one slot; one registry): three asks published at once, as the controller makes them, every step cached (each module's key and commit the same each time: not pushed again): p50", suite: overFleet,
		bench: "BenchmarkAgentOverheadFleet", metric: "fleet-p50-ms", format: "%.1f",
		beside: func(m metrics) string {
			return fmt.Sprintf("p90 %.0f ms; medians of %.0f builds on %.0f machines: events %.1f ms, checkout %.1f ms, ping %.1f ms, solve %.1f ms (cache import %.1f ms, export and push of the image and its attestations %.1f ms, cache export %.1f ms — exported by %.0f of the builds, the others found their input key's cache in the registry — the rest %.1f ms), verify %.1f ms",
				m["fleet-p90-ms"], m["fleet-builds"], m["fleet-machines"], m["fleet-events-ms"], m["fleet-checkout-ms"], m["fleet-ping-ms"], m["fleet-solve-ms"],
				m["fleet-cache-import-ms"], m["fleet-export-ms"], m["fleet-cache-export-ms"], m["fleet-cache-exports"], m["fleet-solve-other-ms"], m["fleet-verify-ms"]) + fleetCPU(m)
		},
		atMost: 100},
	{figure: "a fully cached build of a module whose own layer is tens of megabytes (RUN writes 16 MB of random bytes and seq's text), gzip (build.compression's default): the build on its machine, median", suite: layers,
		bench: "BenchmarkLayerCompression", metric: "gzip-cached-ms", format: "%.0f", beside: layerRow("gzip")},
	{figure: "the same module, build.compression: zstd", suite: layers,
		bench: "BenchmarkLayerCompression", metric: "zstd-cached-ms", format: "%.0f", beside: layerRow("zstd")},
	{figure: "a rebuild with nothing changed, examples/fleet on 3 machines (own buildkitds, one slot each): the farm (`builds rebuild` of every module: all unchanged, nothing dispatched) ÷ `buildx bake` of the same targets on one buildkitd, every step cached there", suite: rebld,
		bench: "BenchmarkFleetRebuild", metric: "nothing-farm/bake", format: "%.3f",
		beside: func(m metrics) string {
			return fmt.Sprintf("medians of %.0f: the farm %.0f ms (request → plan seen settled), bake %.0f ms (buildx %s, remote driver, the bake file generated from the catalogue, images pushed to the same registry); %.0f modules",
				m["runs"], m["nothing-farm-ms"], m["nothing-bake-ms"], buildxVersion, m["modules"])
		},
		atMost: 0.5},
	bakeRow("cold, a new base version, every step after it run again: the farm ÷ bake", "cold-farm/bake", 1.10, func(m metrics) string {
		return fmt.Sprintf("medians of %.0f: the farm %.2f s (plan made → settled; its first run, a fresh farm at first sight, %.2f s), bake %.2f s (its first run, a fresh daemon, %.2f s) · the farm's later cold runs: each build %.2f s beyond its sleep on average, the run %+.2f s on list scheduling of its own builds' durations (sim)",
			m["runs"], m["cold-farm-s"], m["cold-first-sight-farm-s"], m["cold-bake-s"], m["cold-first-bake-s"], m["cold-build-beyond-sleep-s"], m["cold-over-list-s"])
	}),
	bakeRow("forced, every module built again with every step cached (the farm's `builds rebuild --force`; bake of the unchanged sources): the farm ÷ bake", "forced-farm/bake", 1.30, func(m metrics) string {
		return fmt.Sprintf("medians of %.0f: the farm %.2f s (request → plan seen settled), bake %.2f s", m["runs"], m["forced-farm-s"], m["warm-bake-s"])
	}),
	bakeRow("nothing changed, the farm's `builds rebuild` (all unchanged, nothing dispatched): request → plan seen settled", "nothing-farm-s", 0.25, func(m metrics) string {
		return fmt.Sprintf("medians of %.0f; %.3f of bake of the unchanged sources, every step cached (%.2f s)", m["runs"], m["nothing-farm/bake"], m["warm-bake-s"])
	}),
	{figure: "a change to a file the base's Dockerfile never copies, examples/fleet on 3 machines: the plan (push → settled) ÷ the base's build in it", suite: rebld,
		bench: "BenchmarkFleetRebuild", metric: "change/base-build", format: "%.2f",
		beside: func(m metrics) string {
			return fmt.Sprintf("medians of %.0f: the base built (every step cached, the digest it had), the other %.0f modules unchanged, checked each time; the plan %.0f ms, the base's build %.0f ms (its cold build: %.0f ms)",
				m["runs"], m["modules"]-1, m["change-farm-ms"], m["change-base-build-ms"], m["cold-base-build-ms"])
		},
		atMost: 2},
	{figure: "fleet speed-up ÷ K, K = 2: examples/fleet (39 modules, each + 1 s sleep) on 2 buildkitds of max-parallelism 1 vs one", suite: fleet,
		bench: "BenchmarkFleetSpeedup/K=2", metric: "speedup/K", format: "%.3f", beside: fleetSpeedup(2),
		best: "bound-speedup/K"},
	{figure: "fleet speed-up ÷ K, K = 4: examples/fleet (39 modules, each + 1 s sleep) on 4 buildkitds of max-parallelism 1 vs one", suite: fleet,
		bench: "BenchmarkFleetSpeedup/K=4", metric: "speedup/K", format: "%.3f", beside: fleetSpeedup(4),
		best: "bound-speedup/K"},
}

// schedulingRows are BenchmarkScheduling's rows.
var schedulingRows = []row{
	{figure: "priority: a 3-module chain of priority 10 pushed while a 200-module plan keeps 4 machines busy — its makespan, less one build, ÷ its makespan alone", suite: sched,
		bench: "BenchmarkScheduling/urgent", metric: "urgent-busy-less-one-build/alone", format: "%.3f", atMost: 1.2,
		beside: func(m metrics) string {
			return fmt.Sprintf("median of %.0f runs, each on a new farm: alone %.0f ms, beside the big plan %.0f ms (÷ alone %.3f); one build %.0f ms", m["runs"], m["alone-ms"], m["busy-ms"], m["urgent-busy/alone"], m["unit-ms"])
		}},
	{figure: "fair share: two repositories of 40 modules pushed together on 4 machines — distance of one's share of the machine-time, while both have work, from a half", suite: sched,
		bench: "BenchmarkScheduling/fair-share", metric: "share-gap", format: "%.3f", atMost: 0.1,
		beside: func(m metrics) string { return fmt.Sprintf("the first repository's share %.3f", m["share-a"]) }},
	{figure: "the scheduler's own work handing 1,000 idle machines across 20 running plans of 1,000 ready modules (Allot and each plan's Fill), in process: p99 of a round", suite: sched,
		bench: "BenchmarkScheduling/cost-1000", metric: "round-p99-ms", format: "%.2f", atMost: 5,
		beside: func(m metrics) string {
			return fmt.Sprintf("%.0f rounds; %.2f µs per dispatch at p99: what each dispatch of the rows above (ask published → claimed) gains from the scheduler", m["rounds"], m["p99-us/dispatch"])
		}},
}

// failoverRows are BenchmarkFailover's rows.
var failoverRows = []row{
	{figure: "a lost machine: its connection dropped in the middle of a build, with no word (as `kill -9` leaves it) → its ask started on a machine idle all along, the holders' defaults", suite: failover,
		bench: "BenchmarkFailover", metric: "kill-to-started-s", format: "%.1f", atMost: 10,
		beside: func(m metrics) string {
			return fmt.Sprintf("median of %.0f runs, slowest %.1f s; the holders' ack wait is %.0f s, the ask claim's lease three quarters of it", m["runs"], m["kill-to-started-max-s"], m["ack-wait-s"])
		}},
	{figure: "a registry gone for good under two machines (real buildkitds; both turn sick): from the ask's first failing attempt to its failed{infra} \"no healthy machine\", ÷ its --retry-for budget", suite: failover,
		bench: "BenchmarkFailover", metric: "registry-gone/budget", format: "%.3f", atMost: 1.1,
		beside: func(m metrics) string {
			return fmt.Sprintf("%.2f s for a budget of %.0f s", m["registry-gone-to-failed-s"], m["budget-s"])
		}},
}

func init() {
	rows = append(rows, slices.Concat(fleetRows("single"), fleetRows("cluster3"), schedulingRows, failoverRows)...)
}

func main() {
	only := flag.String("only", "", "run only the rows whose benchmark matches this regexp (prints the table; writes no document)")
	verbose := flag.Bool("v", false, "stream go test's output to stderr")
	strict := flag.Bool("strict", false, "exit 1 when a figure misses its target")
	out := flag.String("o", "", "write the document (BENCHMARKS.md) rendered from this run to this file")
	report := flag.String("json", "", "write this run's figures (BENCHMARKS.json) to this file")
	render := flag.String("render", "", "run nothing: render the document from this saved run (BENCHMARKS.json) to -o or stdout")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var code int
	if *render != "" {
		code = renderSaved(*render, *out, os.Stdout, os.Stderr)
	} else {
		code = run(ctx, options{only: *only, verbose: *verbose, strict: *strict, doc: *out, report: *report}, os.Stdout, os.Stderr)
	}
	stop()
	os.Exit(code)
}

type options struct {
	only            string
	verbose, strict bool
	// doc and report are where to write the document and the run's
	// figures; empty writes none.
	doc, report string
}

// Report is one run of the benchmarks: every figure BENCHMARKS.md quotes,
// in its table and in its prose, comes from one Report, which is saved
// beside it (BENCHMARKS.json) so that the document can be rendered again
// (-render) and checked against it.
type Report struct {
	// Ended is when the run ended (UTC); Wall how long it took.
	Ended time.Time `json:"ended"`
	Wall  string    `json:"wall"`
	// Machine describes where it ran; Load is the load average
	// (/proc/loadavg, 1 minute) when the run began and when it ended:
	// other work on the machine shows there.
	Machine string    `json:"machine"`
	Load    [2]string `json:"load"`
	// Host is the host's speed (probeHost) as the run began and as it
	// ended; nil in a run saved before it was probed.
	Host [2]*HostSpeed `json:"host,omitempty"`
	// Suites is each go test run's wall time, by benchmark.
	Suites map[string]string `json:"suites"`
	// Settled is how the machine was found before each benchmark began
	// (settle): quiet after how long, or how busy it still was.
	Settled map[string]string `json:"settled,omitempty"`
	// Failed is each benchmark that could not run, and why.
	Failed map[string]string `json:"failed,omitempty"`
	// Results are the metrics each benchmark reported, by full name.
	Results results `json:"results"`
}

func run(ctx context.Context, o options, stdout, stderr io.Writer) int {
	filter, err := regexp.Compile(o.only)
	if err != nil {
		fmt.Fprintf(stderr, "benchtable: -only %q: %v\n", o.only, err)
		return 2
	}
	if o.only != "" && o.doc != "" {
		fmt.Fprintln(stderr, "benchtable: -o writes the whole document from one run: drop -only, or drop -o to print the rows")
		return 2
	}
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintf(stderr, "benchtable: %v\n", err)
		return 2
	}
	want := map[suite]bool{}
	for _, r := range rows {
		if filter.MatchString(r.bench) {
			want[r.suite] = true
		}
	}

	rep := &Report{Suites: map[string]string{}, Settled: map[string]string{}, Failed: map[string]string{}, Results: results{}}
	rep.Load[0] = loadavg()
	rep.Host[0] = probeHost()
	began := time.Now()
	n := 0
	for _, s := range suites {
		if !want[s] {
			continue
		}
		n++
		args := command(s, s.pattern())
		settled := settle(ctx)
		rep.Settled[s.bench] = settled
		fmt.Fprintf(stderr, "benchtable: [%d/%d] the machine %s\n", n, len(want), settled)
		fmt.Fprintf(stderr, "benchtable: [%d/%d] %s\n", n, len(want), shell(args))
		t0 := time.Now()
		out, err := goTest(ctx, root, args, o.verbose, stderr)
		parse(out, rep.Results)
		rep.Suites[s.bench] = time.Since(t0).Round(time.Second).String()
		if err != nil {
			rep.Failed[s.bench] = err.Error()
			fmt.Fprintf(stderr, "benchtable: %s failed: %v\n%s\n", s.bench, err, tail(out, 30))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		fmt.Fprintf(stderr, "benchtable: %s done in %s\n", s.bench, rep.Suites[s.bench])
	}
	rep.Ended = time.Now().UTC().Truncate(time.Second)
	rep.Wall = time.Since(began).Round(time.Second).String()
	rep.Machine = machine(ctx, root)
	rep.Load[1] = loadavg()
	rep.Host[1] = probeHost()
	fmt.Fprintf(stderr, "benchtable: %s in all; %s\n", rep.Wall, hostLine(rep.Host))
	if saved, err := LoadReport(filepath.Join(root, "BENCHMARKS.json")); err == nil {
		if vs := hostVersus(rep.Host, saved.Host); vs != "" {
			fmt.Fprintf(stderr, "benchtable: %s\n", vs)
		}
	}

	var selected []row
	for _, r := range rows {
		if filter.MatchString(r.bench) {
			selected = append(selected, r)
		}
	}
	tab, code := table(selected, rep, o.strict)
	fmt.Fprint(stdout, tab)
	if o.report != "" {
		data, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(o.report, append(data, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "benchtable: writing %s: %v\n", o.report, err)
			return 1
		}
	}
	if o.doc != "" {
		doc, err := Render(rep)
		if err == nil {
			err = os.WriteFile(o.doc, []byte(doc), 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "benchtable: writing %s: %v\n", o.doc, err)
			return 1
		}
	}
	return code
}

// renderSaved renders the document from a saved run to out (stdout when
// empty).
func renderSaved(from, out string, stdout, stderr io.Writer) int {
	rep, err := LoadReport(from)
	if err == nil {
		var doc string
		if doc, err = Render(rep); err == nil {
			if out == "" {
				_, err = io.WriteString(stdout, doc)
			} else {
				err = os.WriteFile(out, []byte(doc), 0o644)
			}
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "benchtable: %v\n", err)
		return 1
	}
	return 0
}

// LoadReport reads a saved run.
func LoadReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return &rep, nil
}

// table is the Markdown table of the rows from a run, and the exit status:
// 1 when a row has no figure, and with strict when a figure misses its
// target.
func table(selected []row, rep *Report, strict bool) (string, int) {
	var b strings.Builder
	code := 0
	fmt.Fprintln(&b, "| figure | measured | side by side, same run | target | result | reproduce |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|")
	for _, r := range selected {
		measured, beside, result := "—", "", ""
		m, ok := rep.Results[r.bench]
		v, have := m[r.metric]
		switch {
		case !have && rep.Failed[r.suite.bench] != "":
			result = "ERROR: " + rep.Failed[r.suite.bench]
			code = 1
		case !ok || !have:
			result = "ERROR: no " + r.metric + " reported"
			code = 1
		default:
			measured = fmt.Sprintf(r.format, v) + r.unitSuffix()
			if r.beside != nil {
				beside = r.beside(m)
			}
			noTarget := r.atMost == 0 && r.atLeast == 0
			switch best, ok := m[r.best]; {
			case noTarget && r.best != "" && ok:
				result = fmt.Sprintf("no target; %.0f %% of the bound", 100*v/best)
			case noTarget:
				result = "no target"
			case r.meets(v):
				result = "pass"
			default:
				result = "FAIL"
				if r.best != "" && ok && !r.meets(best) {
					result += fmt.Sprintf(" (list scheduling with the true durations gives %.3f)", best)
				}
				if strict {
					code = 1
				}
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.figure, measured, beside, r.target(), result, r.reproduce())
	}
	return b.String(), code
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

// loadavg is the 1-minute load average, or "?".
func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
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

// fleetCPU is what a fleet build costs the machine's cores, where the run
// measured it: the CPU of the buildkitds and of the benchmark's process per
// build, and the p50 that CPU alone allows with every machine building at
// once on those cores.
func fleetCPU(m metrics) string {
	daemons, self, cores := m["fleet-buildkitd-cpu-ms"], m["fleet-process-cpu-ms"], m["fleet-cores"]
	if cores == 0 {
		return ""
	}
	return fmt.Sprintf(" · CPU per build: buildkitd %.0f ms, the agents, registry and bus %.0f ms; %.0f builds at once on %.0f cores take at least %.0f ms each from CPU alone",
		daemons, self, m["fleet-machines"], cores, (daemons+self)*m["fleet-machines"]/cores)
}

// cpuCeiling is the most modules a second the machine's cores allow with
// the CPU a module took (the servers' and this process's, all of it on the
// one machine): a throughput row's ceiling from CPU alone; "" for runs saved
// without the cores.
func cpuCeiling(m metrics) string {
	per, cores := m["server-cpu-ms/module"]+m["bench-cpu-ms/module"], m["cores"]
	if per <= 0 || cores == 0 {
		return ""
	}
	return fmt.Sprintf("; %.0f cores allow at most %.0f modules/s from that CPU alone", cores, 1000*cores/per)
}
