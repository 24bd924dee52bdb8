package agent_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// fleetMachines is the cached fleet case's machine count.
const fleetMachines = 3

// BenchmarkAgentOverheadFleet is BenchmarkAgentOverhead's fully cached
// case on a fleet: three machines — each an agent of one slot with a
// buildkitd of its own (its own state, one step at a time) and a registry
// client of its own — sharing one registry and the bus. Each round
// publishes three asks at once, as the controller makes them (cascade.Asks:
// the registry build cache imported, and exported unless the registry
// holds the input key's already), one for each of three
// modules built from the same Dockerfile as BenchmarkAgentOverhead's with
// a nonce of its own; every step of every build is answered from the cache
// (checked in each build's output). Whichever machine is free takes an
// ask, so a machine often builds a module another built last: it imports
// the cache from the registry. Each ask carries an input key, as the
// controller's do, so a build whose key's cache the registry holds does
// not export it again (cachemark.go); in turn with each round, a round of
// the same asks without a key, for three more modules of their own
// (fleet-export-always-p50-ms: the cache exported after every build, as
// before). Each build is measured from publishing its
// ask to its built arriving, p50 and p90 over the builds, and broken down
// as the single-machine cached rows are (fleet-*: the events, the spans
// the build reports — checkout, ping, solve and in it the cache import,
// the export and push of the image and its attestations, the cache export
// — then verify); fleet-cache-exports is how many exported their cache.
// Three rounds of each first, unmeasured, fill every cache.
// MESHBUILD_BENCH=tiny: two rounds of each.
func BenchmarkAgentOverheadFleet(b *testing.B) {
	testenv.RequireBuildkit(b)
	rounds := 20
	if benchTiny() {
		rounds = 2
	}
	host := registrytest.Registry(b)
	baseRef := testenv.Busybox(b, host)
	base := mesh.Base{Module: "runtime", Image: host + "/busybox", Digest: baseRef[strings.LastIndex(baseRef, "@")+1:]}
	files := map[string]string{}
	for m := range fleetMachines {
		files[fmt.Sprintf("app-%d/Dockerfile", m+1)] = overheadDockerfile
		files[fmt.Sprintf("app-%d/nonce.txt", m+1)] = fmt.Sprintf("module %d\n", m+1)
	}
	gitDir, commit := testenv.GitRepo(b, files)

	s, nc, js := benchSeat(b)
	rec := &askRecords{at: map[string]askRecord{}}
	var workers []agent.Worker
	for range fleetMachines {
		addr := testenv.BuildkitdWith(b, buildkitd.Options{RegistryHosts: []string{host}, MaxParallelism: 1})
		bk, err := agent.NewBuildKit(addr, agent.BuildKitOptions{Registry: registry.NewClient(registry.WithInsecure(true))})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bk.Close() })
		workers = append(workers, &recordingWorker{rec: rec,
			w: &agent.BuildWorker{Sources: &agent.Sources{Dir: b.TempDir()}, Builder: bk}})
	}
	benchAgentsEach(b, s, js, workers)
	ev := watchSeat(b, nc)

	n := 0
	type fleetBuild struct {
		total, events time.Duration
		spans         agent.Spans
	}
	// round publishes one ask per module at once and waits for every
	// built; check says whether each build must have found its steps
	// cached.
	round := func(check, keyed bool) []fleetBuild {
		var asks []mesh.Ask
		sent := map[string]time.Time{}
		for m := range fleetMachines {
			n++
			module := fmt.Sprintf("fleet-%d", m+1)
			if !keyed {
				module = fmt.Sprintf("fleet-nokey-%d", m+1)
			}
			a := cascade.Asks(host, cascade.Submit{Plan: "p-bench", Module: module,
				AskID: fmt.Sprintf("fleet-%d", n), Key: fmt.Sprintf("fleet-%d-%s", m+1, commit),
				Source: planner.Source{Repo: gitDir, Commit: commit, Path: fmt.Sprintf("app-%d", m+1)}})[0]
			a.Bases = []mesh.Base{base}
			if !keyed {
				a.Key = ""
			}
			asks = append(asks, a)
		}
		for _, a := range asks {
			sent[a.ID] = time.Now()
			publishAsk(b, js, a)
		}
		var out []fleetBuild
		for _, a := range asks {
			arrived := ev.wait(b, mesh.EventBuilt, a.ID, 5*time.Minute)
			r := rec.get(b, a.ID)
			t0 := sent[a.ID]
			out = append(out, fleetBuild{total: arrived.Sub(t0), events: r.begun.Sub(t0) + arrived.Sub(r.ended), spans: r.spans})
			ev.wait(b, logFinal, a.ID, 10*time.Second)
			for _, step := range []string{" COPY ", " RUN "} {
				if !check {
					break
				}
				if cached, found := ev.cached(a.ID, step); !found || !cached {
					b.Fatalf("ask %s: the%s step found %t, cached %t; want it cached", a.ID, step, found, cached)
				}
			}
		}
		return out
	}
	var builds, unkeyed []fleetBuild
	defer func() {
		if testing.Verbose() {
			ev.mu.Lock()
			b.Logf("the last build's output:\n%s", strings.Join(ev.logs[fmt.Sprintf("fleet-%d", n)], "\n"))
			ev.mu.Unlock()
		}
	}()
	var cpuDaemons, cpuSelf time.Duration
	for b.Loop() {
		for range 3 {
			round(false, true)
			round(false, false)
		}
		// The CPU the measured rounds cost: the buildkitds (this process's
		// children) and this process (the agents, the registry, the bus).
		d0, s0 := childCPU("buildkitd"), selfCPU()
		for i := range rounds {
			if i%2 == 0 {
				builds = append(builds, round(true, true)...)
				unkeyed = append(unkeyed, round(true, false)...)
			} else {
				unkeyed = append(unkeyed, round(true, false)...)
				builds = append(builds, round(true, true)...)
			}
		}
		cpuDaemons, cpuSelf = childCPU("buildkitd")-d0, selfCPU()-s0
	}
	var totals []time.Duration
	for _, c := range builds {
		totals = append(totals, c.total)
	}
	slices.Sort(totals)
	med := func(f func(fleetBuild) time.Duration) float64 {
		var ds []time.Duration
		for _, c := range builds {
			ds = append(ds, f(c))
		}
		slices.Sort(ds)
		return ms(ds[len(ds)/2])
	}
	b.ReportMetric(ms(quantile(totals, 0.50)), "fleet-p50-ms")
	b.ReportMetric(ms(quantile(totals, 0.90)), "fleet-p90-ms")
	b.ReportMetric(med(func(c fleetBuild) time.Duration { return c.events }), "fleet-events-ms")
	for _, span := range []string{agent.SpanCheckout, agent.SpanPing, agent.SpanSolve, agent.SpanCacheImport, agent.SpanExport, agent.SpanCacheExport, agent.SpanVerify} {
		b.ReportMetric(med(func(c fleetBuild) time.Duration { return c.spans.Took(span) }), "fleet-"+span+"-ms")
	}
	b.ReportMetric(med(func(c fleetBuild) time.Duration {
		return c.spans.Took(agent.SpanSolve) - c.spans.Took(agent.SpanCacheImport) - c.spans.Took(agent.SpanExport) - c.spans.Took(agent.SpanCacheExport)
	}), "fleet-solve-other-ms")
	// How many builds exported their cache (the rest skipped it).
	exported := 0
	for _, c := range builds {
		if c.spans.Took(agent.SpanCacheExport) > 0 {
			exported++
		}
	}
	b.ReportMetric(float64(exported), "fleet-cache-exports")
	b.ReportMetric(float64(len(builds)), "fleet-builds")
	// In turn with those, the same asks without an input key: the cache
	// exported after every build, as before cachemark.go.
	var before []time.Duration
	for _, c := range unkeyed {
		before = append(before, c.total)
	}
	slices.Sort(before)
	b.ReportMetric(ms(quantile(before, 0.50)), "fleet-export-always-p50-ms")
	b.ReportMetric(fleetMachines, "fleet-machines")
	// CPU per build over the measured rounds (keyed and unkeyed alike): what
	// three builds at once ask of the machine's cores.
	all := float64(len(builds) + len(unkeyed))
	b.ReportMetric(ms(cpuDaemons)/all, "fleet-buildkitd-cpu-ms")
	b.ReportMetric(ms(cpuSelf)/all, "fleet-process-cpu-ms")
	b.ReportMetric(float64(runtime.NumCPU()), "fleet-cores")
}

// childCPU is the CPU time (user and system) of this process's children
// named comm, read from /proc; 0 where /proc is not there.
func childCPU(comm string) time.Duration {
	dirs, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var ticks int64
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid … utime(14) stime(15): comm may hold spaces.
		open, closing := strings.IndexByte(string(raw), '('), strings.LastIndexByte(string(raw), ')')
		if open < 0 || closing < open || string(raw[open+1:closing]) != comm {
			continue
		}
		f := strings.Fields(string(raw[closing+1:]))
		if len(f) < 13 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid != self {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + st
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ
}

// selfCPU is this process's CPU time, user and system.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// askRecord is when a worker began and ended an ask, and its spans.
type askRecord struct {
	begun, ended time.Time
	spans        agent.Spans
}

// askRecords are the records of every ask, by id, of workers that run at
// once.
type askRecords struct {
	mu sync.Mutex
	at map[string]askRecord
}

func (r *askRecords) get(tb testing.TB, id string) askRecord {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	x, ok := r.at[id]
	if !ok {
		tb.Fatalf("no worker recorded ask %s", id)
	}
	return x
}

// recordingWorker records each Work of the worker it wraps in rec.
type recordingWorker struct {
	w   agent.Worker
	rec *askRecords
}

func (t *recordingWorker) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	begun := time.Now()
	res, err := t.w.Work(ctx, a, log)
	ended := time.Now()
	t.rec.mu.Lock()
	t.rec.at[a.ID] = askRecord{begun: begun, ended: ended, spans: res.Spans}
	t.rec.mu.Unlock()
	return res, err
}
