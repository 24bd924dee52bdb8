package cascade_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/sim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// A thousand machines on one seat. The NATS server runs in its own process
// (nats-server of the module's nats-server version, built with go build),
// so that its memory and CPU are its own, as SCALE.md measured them: one
// server with the default setup's settings, or three joined by routes
// (streams and buckets at three replicas, sync_interval: always). The real
// controller (cascade.New) raises the catalogue and runs plans; every
// simulated machine is a real agent (agent.New, the holder loop with the
// default config: Fetch(1) renewed every 5 s, one slot) on its own
// connection, given every server's URL. Their worker sleeps the module's
// simulated duration and pushes nothing (sleeper, as the other controller
// benchmarks).
//
// Each sub-benchmark reports:
//   - dispatch p50/p99/max: fleetAsks (1,000) asks published one at a time (a JetStream
//     publish, as the controller's) to idle agents, until a machine's
//     claim of it is stored (seen by a watch of the ask claims bucket,
//     meshtest.Claims: the build begins once it is; its started is
//     announced only after the agent's StartedDelay);
//   - modules/s: a 10,000-module plan with zero-length builds through the
//     controller, median of 3 plans (1 on the cluster), as
//     BenchmarkControllerThroughput10000;
//   - makespan/lb at 1,000 agents: the same 10,000 modules with lognormal
//     durations (1 unit = 400 ms), the plan run once unmeasured so the
//     controller knows every duration, then measured against the bound
//     max(critical path, work ÷ machines): the median of 3 runs, each a
//     new plan on the same farm (on three servers one run ranged
//     1.04–1.13 of the bound, the same code), the fastest and slowest
//     beside it;
//   - the server's resident memory (peak, per node) and its CPU per
//     module, and the fetch errors the agents logged (a 409 Exceeded
//     MaxWaiting among them) — any is a failure.
//
//	go test -run XXX -bench BenchmarkFleet1000 -benchtime 1x -timeout 30m ./cascade
//
// Diagnostics: MESHBUILD_FLEET_SUBJECTS=1 logs the messages per module by
// subject; MESHBUILD_FLEET_PROFILE=dir writes each node's CPU profile of
// the dispatch phase and of the first 5 s of the throughput phase to dir
// (natsProcs.profile); MESHBUILD_FLEET_CRIT=1 logs the chain that ended
// the makespan run, where each module on it waited (critChain);
// MESHBUILD_FLEET_MAKESPANS=n measures n makespan runs instead of 5 (each
// is logged); MESHBUILD_FLEET_TURNS=1 writes the controller's debug lines
// to stderr: each turn's steps, what they did and how long they took.
//
// single/agents=10000 is issue #23's 10,000 machines on one server: the
// dispatch and throughput figures, the server's memory and what builds in
// hand cost it (fleetBusy), no makespan (the consumer's MaxWaiting, the
// open files limit and the agents' pull wait come from
// mesh.FleetSettingsOf).
//
// TestFleet1000Tiny runs the same at 20 agents under `make test`.

// fleetAsks is how many asks the dispatch figures are measured on: the
// p99 of 200 was their second slowest, and one moment of the host's moved
// it by half.
const fleetAsks = 1000

// fleetUnit is the real time of one unit of simulated duration.
const fleetUnit = 400 * time.Millisecond

func BenchmarkFleet1000(b *testing.B) {
	if benchTiny() {
		// `make test`: the benchmark's own code on one small fleet, so
		// that it keeps running without taking minutes under -race
		// (TestFleet1000Tiny runs fleetRun on one server and a cluster).
		b.Run("tiny/nodes=1", func(b *testing.B) {
			fleetBench(b, fleetSize{nodes: 1, agents: 5, asks: 10, modules: 50, plans: 1, makespan: true, unit: 50 * time.Millisecond})
		})
		return
	}
	for _, bus := range []int{1, 3} {
		for _, agents := range []int{50, 1000, 10000} {
			if bus == 3 && agents == 10000 {
				continue // issue #23 asks 10,000 of one server
			}
			name := fmt.Sprintf("single/agents=%d", agents)
			if bus == 3 {
				name = fmt.Sprintf("cluster3/agents=%d", agents)
			}
			// sync_interval: always makes the cluster's writes slow: one
			// throughput plan there.
			plans := map[int]int{1: 3, 3: 1}[bus]
			b.Run(name, func(b *testing.B) {
				fleetBench(b, fleetSize{nodes: bus, agents: agents, asks: fleetAsks, modules: 10000, plans: plans, makespan: agents == 1000, makespans: 5,
					busy: map[bool]time.Duration{true: busyWindow}[bus == 1 && agents == 10000]})
			})
		}
	}
}

// TestFleet1000Tiny keeps BenchmarkFleet1000 from rotting: the same path,
// 20 agents on one server and on a cluster of three, a small plan.
func TestFleet1000Tiny(t *testing.T) {
	for _, nodes := range []int{1, 3} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			// busy: 3 s, longer than an agent's heartbeat (2.7 s): a window
			// of 1 s could fall between the builds' started events and their
			// first heartbeats, and count no message (seen once: "busy-server-msgs/s = 0").
			m := fleetRun(t, fleetSize{nodes: nodes, agents: 20, asks: 20, modules: 200, plans: 1, makespan: true, unit: 50 * time.Millisecond,
				busy: 3 * time.Second})
			// (The busy figures less the idle ones are noise at this size:
			// fleetBusy's own check, every build in hand throughout, runs.)
			for _, k := range []string{"p50-ms", "p99-ms", "modules/s", "makespan/lb", "server-rss-MiB", "busy-builds", "busy-server-msgs/s"} {
				if m[k] <= 0 {
					t.Errorf("%s = %v, want a measurement", k, m[k])
				}
			}
			t.Logf("%v", m)
		})
	}
}

type fleetSize struct {
	nodes, agents, asks, modules, plans int
	makespan                            bool
	makespans                           int           // runs of the makespan plan, the median reported (default 1)
	busy                                time.Duration // measure what builds in hand cost the server over this window (fleetBusy); 0 does not
	unit                                time.Duration // default fleetUnit
}

func fleetBench(b *testing.B, sz fleetSize) {
	var m map[string]float64
	for b.Loop() {
		m = fleetRun(b, sz)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.ReportMetric(m[k], k)
	}
}

// fleetRun measures one fleet and returns its figures by unit.
func fleetRun(tb testing.TB, sz fleetSize) map[string]float64 {
	if sz.unit == 0 {
		sz.unit = fleetUnit
	}
	raiseNoFile(tb, sz.agents)
	out := map[string]float64{}
	bus := startNATSProcs(tb, sz.nodes)
	d := sim.RandomLayeredDAG(sz.modules, 10, 1)
	cfg := cascade.DefaultConfig()
	cfg.Replicas = sz.nodes
	f, warns := newFleetFarm(tb, bus, fleetCatalogue(tb, d, sz.agents), cfg, sz.agents)
	out["fleet-ready-s"] = f.ready.Seconds()
	out["shards"] = float64(max(f.shards, 1))

	// MaxWaiting covers every slot with a quarter to spare (SCALE.md).
	cons, err := f.js.Consumer(context.Background(), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		tb.Fatal(err)
	}
	need := mesh.FleetSettingsOf(mesh.Fleet{Machines: sz.agents, Slots: 1})
	if mw := cons.CachedInfo().Config.MaxWaiting; mw < need.MaxWaiting {
		tb.Fatalf("the seat's consumer has MaxWaiting %d, want at least %d for %d slots", mw, need.MaxWaiting, sz.agents)
	}

	// Dispatch to idle agents.
	nc, _ := f.connect()
	defer nc.Close()
	profiled := bus.profile(tb, "dispatch", 5*time.Second)
	lat := fleetDispatch(tb, f, nc, sz.asks)
	profiled()
	out["p50-ms"] = msOf(quantileOf(lat, 0.50))
	out["p99-ms"] = msOf(quantileOf(lat, 0.99))
	out["max-ms"] = msOf(lat[len(lat)-1])
	out["asks"] = float64(len(lat))

	// Throughput: zero-length builds.
	zero := d
	zero.Dur = make([]float64, d.Len())
	var subjects *subjectCounter
	if os.Getenv("MESHBUILD_FLEET_SUBJECTS") != "" {
		subjects = countSubjects(tb, nc)
	}
	cpu0, ops0, pcpu0 := bus.cpu(), bus.ops(tb), processCPU()
	var rates []float64
	var runs []planRun
	profiled = bus.profile(tb, "throughput", 5*time.Second)
	for range sz.plans {
		r := f.run(zero, 0, 10*time.Minute)
		rates = append(rates, float64(d.Len())/r.Makespan.Seconds())
		runs = append(runs, r)
	}
	profiled()
	slices.Sort(rates)
	out["modules/s"] = rates[len(rates)/2]
	out["slowest-modules/s"] = rates[0]
	built := float64(sz.plans * d.Len())
	out["server-cpu-ms/module"] = 1000 * (bus.cpu() - cpu0).Seconds() / built
	out["bench-cpu-ms/module"] = 1000 * (processCPU() - pcpu0).Seconds() / built
	ops := bus.ops(tb)
	if subjects != nil {
		subjects.report(tb, int(built))
	}
	// The plans' modules are read for their first start once the farm's
	// CPU and messages are counted: the benchmark's reads (every module
	// of every plan) are not the farm's cost.
	var first time.Duration
	for _, r := range runs {
		first += firstStarted(tb, f.benchFarm, r)
	}
	out["first-start-ms"] = msOf(first / time.Duration(len(runs)))
	out["server-in-msgs/module"] = (ops.In - ops0.In) / built
	out["server-route-in-msgs/module"] = (ops.RouteIn - ops0.RouteIn) / built
	out["server-out-msgs/module"] = (ops.Out - ops0.Out) / built
	out["server-js-api/module"] = (ops.API - ops0.API) / built
	out["cores"] = float64(runtime.NumCPU())

	if sz.busy > 0 {
		for k, v := range fleetBusy(tb, f, bus, d, sz.busy) {
			out[k] = v
		}
	}

	// Makespan once the durations are known: the median of sz.makespans
	// runs (1 when unset), each a new plan on the same farm.
	if sz.makespan {
		lb := sim.LowerBound(d, sz.agents)
		timeout := time.Duration(10*lb*float64(sz.unit)) + 5*time.Minute
		f.run(d, sz.unit, timeout) // learn
		runs := max(1, sz.makespans)
		if n, _ := strconv.Atoi(os.Getenv("MESHBUILD_FLEET_MAKESPANS")); n > 0 {
			runs = n
		}
		var spans []time.Duration
		for i := range runs {
			r := f.run(d, sz.unit, timeout)
			critChain(tb, f.js, r.Rec.ID, f.modules(tb, r.Rec.ID), r.Rec.Created, *f.work.dur.Load())
			tb.Logf("makespan run %d: %.3f of the bound", i+1, r.Makespan.Seconds()/(lb*sz.unit.Seconds()))
			spans = append(spans, r.Makespan)
		}
		slices.Sort(spans)
		bound := lb * sz.unit.Seconds()
		out["makespan/lb"] = spans[len(spans)/2].Seconds() / bound
		out["makespan-s"] = spans[len(spans)/2].Seconds()
		out["makespan-min/lb"] = spans[0].Seconds() / bound
		out["makespan-max/lb"] = spans[len(spans)-1].Seconds() / bound
		out["makespan-runs"] = float64(runs)
		out["lb-s"] = bound
	}
	f.waitIdle()
	out["server-rss-MiB"] = bus.peakRSS() / (1 << 20)
	out["agents"] = float64(sz.agents)
	n, sample := warns.fetchErrors()
	out["fetch-errors"] = float64(n)
	if n > 0 {
		tb.Errorf("the agents logged %d fetch errors (a pull dropped or refused), e.g. %s", n, sample)
	}
	out["server-api-dropped"] = float64(bus.apiDropped(tb))
	return out
}

// fleetCatalogue is benchCatalogue with the build seat split into the
// shards a fleet of agents machines of one slot wants
// (mesh.FleetSettingsOf).
func fleetCatalogue(tb testing.TB, d sim.DAG, agents int) *mesh.Catalogue {
	shards := mesh.FleetSettingsOf(mesh.Fleet{Machines: agents, Slots: 1}).Shards
	if n, err := strconv.Atoi(os.Getenv("MESHBUILD_FLEET_SHARDS")); err == nil && n > 0 {
		shards = n // a diagnostic: another split of the same fleet
	}
	return mesh.NewCatalogue(meshtest.Sharded(benchCatalogue(tb, d).Modules, shards))
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func quantileOf(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// raiseNoFile raises the soft limit of open files to the hard limit: every
// agent's connection is a descriptor here (and its own files), and the
// server, which inherits the limit, needs mesh.FleetSettingsOf's. A hard limit too low for the
// fleet is a failure.
func raiseNoFile(tb testing.TB, agents int) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		tb.Fatal(err)
	}
	need := max(uint64(agents)+512, mesh.FleetSettingsOf(mesh.Fleet{Machines: agents, Slots: 1}).NoFile)
	if l.Cur < need && l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			tb.Fatalf("raising the open files limit to %d: %v", l.Max, err)
		}
	}
	if l.Cur < need {
		tb.Fatalf("open files limit %d (hard %d): %d agents need about %d (raise it: ulimit -n, LimitNOFILE)", l.Cur, l.Max, agents, need)
	}
}

// --- the server processes ---------------------------------------------------

var (
	natsBinOnce sync.Once
	natsBin     string
	natsBinErr  error
)

// natsServerBinary builds nats-server from the module's version of it.
func natsServerBinary(tb testing.TB) string {
	natsBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "meshbuild-nats-server-")
		if err != nil {
			natsBinErr = err
			return
		}
		natsBin = filepath.Join(dir, "nats-server")
		out, err := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsBinErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsBinErr != nil {
		tb.Fatal(natsBinErr)
	}
	return natsBin
}

// natsProcs are nats-server processes: one, or a cluster.
type natsProcs struct {
	urls string
	pids []int
	// monitors are the nodes' monitoring endpoints (http://host:port).
	monitors []string
	// logs are the nodes' log files.
	logs []string
	// profs are the nodes' profiling endpoints (MESHBUILD_FLEET_PROFILE).
	profs []string
}

// profile takes a CPU profile of every node for the next d
// (MESHBUILD_FLEET_PROFILE=dir: a diagnostic of where the server's time
// goes in a phase) into dir/<phase>-n<i>.pprof, for `go tool pprof` with
// the server's binary; wait returns once they are written. Nothing when
// the variable is not set.
func (p *natsProcs) profile(tb testing.TB, phase string, d time.Duration) (wait func()) {
	dir := os.Getenv("MESHBUILD_FLEET_PROFILE")
	if dir == "" || len(p.profs) == 0 {
		return func() {}
	}
	var wg sync.WaitGroup
	for i, base := range p.profs {
		wg.Go(func() {
			url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, int(d.Seconds()))
			resp, err := http.Get(url)
			if err != nil {
				tb.Logf("profiling node %d: %v", i+1, err)
				return
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-n%d.pprof", phase, i+1)), data, 0o644)
			}
			if err != nil {
				tb.Logf("profiling node %d: %v", i+1, err)
			}
		})
	}
	return wg.Wait
}

// apiDropped is how many JetStream API requests the nodes dropped, their
// queue full, as their logs say ("JetStream API info queue limit reached,
// dropping 10000 requests").
func (p *natsProcs) apiDropped(tb testing.TB) int {
	n := 0
	for _, f := range p.logs {
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			_, after, ok := strings.Cut(l, "limit reached, dropping ")
			if !ok {
				continue
			}
			var d int
			if _, err := fmt.Sscanf(after, "%d", &d); err == nil {
				n += d
			}
		}
	}
	return n
}

func startNATSProcs(tb testing.TB, nodes int) *natsProcs {
	tb.Helper()
	bin := natsServerBinary(tb)
	// One call, so that no port is given twice.
	ports := natstest.FreePorts(tb, 4*nodes)
	clients, routes, mons, profs := ports[:nodes], ports[nodes:2*nodes], ports[2*nodes:3*nodes], ports[3*nodes:]
	var rs, us []string
	for i := range nodes {
		rs = append(rs, fmt.Sprintf("nats://127.0.0.1:%d", routes[i]))
		us = append(us, fmt.Sprintf("nats://127.0.0.1:%d", clients[i]))
	}
	p := &natsProcs{urls: strings.Join(us, ",")}
	for i := range nodes {
		dir := tb.TempDir()
		conf := fmt.Sprintf("server_name: n%d\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\n", i+1, clients[i], mons[i])
		if os.Getenv("MESHBUILD_FLEET_PROFILE") != "" {
			conf += fmt.Sprintf("prof_port: %d\n", profs[i])
			p.profs = append(p.profs, fmt.Sprintf("http://127.0.0.1:%d", profs[i]))
		}
		// The JetStream API queue a fleet starting at once needs.
		queue := mesh.FleetSettingsOf(mesh.DefaultFleet).APIQueueLimit
		p.monitors = append(p.monitors, fmt.Sprintf("http://127.0.0.1:%d", mons[i]))
		if nodes == 1 {
			conf += fmt.Sprintf("jetstream { store_dir: %q, request_queue_limit: %d }\n", filepath.Join(dir, "js"), queue)
		} else {
			conf += fmt.Sprintf("jetstream { store_dir: %q, sync_interval: always, request_queue_limit: %d }\n", filepath.Join(dir, "js"), queue)
			conf += fmt.Sprintf("cluster { name: %s, listen: 127.0.0.1:%d, routes: [%s] }\n", natstest.ClusterName, routes[i], strings.Join(rs, ", "))
		}
		cf := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
			tb.Fatal(err)
		}
		p.logs = append(p.logs, filepath.Join(dir, "nats.log"))
		logf, err := os.Create(p.logs[i])
		if err != nil {
			tb.Fatal(err)
		}
		cmd := exec.Command(bin, "-c", cf)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		p.pids = append(p.pids, cmd.Process.Pid)
		tb.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			logf.Close()
		})
	}
	// Ready: JetStream answers (on a cluster, once a meta leader is elected).
	deadline := time.Now().Add(60 * time.Second)
	for {
		nc, err := nats.Connect(p.urls)
		if err == nil {
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
			nc.Close()
			if err == nil {
				return p
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("nats-server (%d nodes) not ready in 60s: %v", nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// peakRSS is the largest peak resident set of the nodes, in bytes.
func (p *natsProcs) peakRSS() float64 {
	var peak float64
	for _, pid := range p.pids {
		if v := procStatus(pid, "VmHWM:"); v > peak {
			peak = v
		}
	}
	return peak
}

// procStatus reads a "kB" field of /proc/pid/status, in bytes.
func procStatus(pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb * 1024
		}
	}
	return 0
}

// serverOps are a server's message and JetStream API counters (/varz),
// summed over the nodes.
type serverOps struct {
	In, Out, API float64
	// RouteIn is what the nodes took in from each other (routes): on a
	// cluster, client messages forwarded to the node with interest and
	// JetStream's replication (raft) — none of it from a client.
	RouteIn float64
}

// ops reads the nodes' counters now.
func (p *natsProcs) ops(tb testing.TB) serverOps {
	var total serverOps
	for _, m := range p.monitors {
		resp, err := http.Get(m + "/varz")
		if err != nil {
			tb.Fatalf("reading %s/varz: %v", m, err)
		}
		var v struct {
			InMsgs    float64 `json:"in_msgs"`
			OutMsgs   float64 `json:"out_msgs"`
			JetStream struct {
				Stats struct {
					API struct {
						Total float64 `json:"total"`
					} `json:"api"`
				} `json:"stats"`
			} `json:"jetstream"`
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil {
			tb.Fatalf("decoding %s/varz: %v", m, err)
		}
		total.In += v.InMsgs
		total.Out += v.OutMsgs
		total.API += v.JetStream.Stats.API.Total
		total.RouteIn += routeIn(tb, m)
	}
	return total
}

// routeIn is the messages a node took in over its routes (/routez).
func routeIn(tb testing.TB, monitor string) float64 {
	resp, err := http.Get(monitor + "/routez")
	if err != nil {
		tb.Fatalf("reading %s/routez: %v", monitor, err)
	}
	defer resp.Body.Close()
	var v struct {
		Routes []struct {
			InMsgs float64 `json:"in_msgs"`
		} `json:"routes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		tb.Fatalf("decoding %s/routez: %v", monitor, err)
	}
	in := 0.0
	for _, r := range v.Routes {
		in += r.InMsgs
	}
	return in
}

// processCPU is this process's CPU time so far (user + system): the
// controller's and every simulated agent's.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// subjectCounter counts the messages the server routes during a phase, by
// kind of subject: a diagnostic (MESHBUILD_FLEET_SUBJECTS=1) of where the
// server's operations per module go. Its own subscription costs the server
// a delivery per message, so the figures reported are taken without it.
type subjectCounter struct {
	mu  sync.Mutex
	by  map[string]int
	sub *nats.Subscription
}

func countSubjects(tb testing.TB, nc *nats.Conn) *subjectCounter {
	sc := &subjectCounter{by: map[string]int{}}
	var err error
	sc.sub, err = nc.Subscribe(">", func(m *nats.Msg) {
		sc.mu.Lock()
		k := subjectKind(m.Subject)
		if strings.HasPrefix(m.Reply, "$JS.ACK.") {
			// A consumer's delivery (to its inbox, under the subject the
			// message was stored on), not a publish.
			k += " (delivered)"
		}
		sc.by[k]++
		sc.mu.Unlock()
	})
	if err != nil {
		tb.Fatal(err)
	}
	sc.sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return sc
}

// subjectKind is a subject without what varies per message (ids, keys,
// inboxes).
func subjectKind(s string) string {
	t := strings.Split(s, ".")
	switch {
	case strings.HasPrefix(s, "_INBOX."):
		return "_INBOX (replies, deliveries)"
	case strings.HasPrefix(s, "$JS.ACK."):
		return "$JS.ACK." + t[2] + " (acks)"
	case strings.HasPrefix(s, "$KV.ASKS_") && len(t) > 2:
		return "$KV." + t[1] + ".<ask>"
	case strings.HasPrefix(s, "$KV.") && len(t) > 2:
		return "$KV." + t[1] + "." + t[2]
	case strings.HasPrefix(s, "$JS.API.DIRECT.GET.") && len(t) > 4:
		return "$JS.API.DIRECT.GET." + t[4]
	case strings.HasPrefix(s, "$JS.API.") && len(t) > 4:
		return strings.Join(t[:min(len(t), 5)], ".")
	case len(t) > 6 && t[0] == "mesh" && t[3] == "on":
		// A holder's event: the machine (and a log's ask) varied.
		return strings.Join(t[:4], ".") + ".<machine>." + t[5] + "." + t[6]
	case len(t) > 5:
		return strings.Join(t[:5], ".") + ".*"
	}
	return s
}

func (sc *subjectCounter) report(tb testing.TB, modules int) {
	_ = sc.sub.Unsubscribe()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	kinds := slices.Sorted(maps.Keys(sc.by))
	slices.SortStableFunc(kinds, func(a, b string) int { return sc.by[b] - sc.by[a] })
	var sb strings.Builder
	total := 0
	for _, k := range kinds {
		total += sc.by[k]
		fmt.Fprintf(&sb, "\n  %8.3f  %s", float64(sc.by[k])/float64(modules), k)
	}
	// On stderr as well: a benchmark's log is cut to its first lines.
	msg := fmt.Sprintf("messages per module by subject (%.3f in all):%s", float64(total)/float64(modules), sb.String())
	tb.Log(msg)
	fmt.Fprintf(os.Stderr, "%s: %s\n", tb.Name(), msg)
}

// cpu is the nodes' CPU time so far (user + system).
func (p *natsProcs) cpu() time.Duration {
	var total time.Duration
	for _, pid := range p.pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command name (which may hold spaces).
		s := string(data)
		fs := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fs) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(fs[11], 10, 64)
		st, _ := strconv.ParseInt(fs[12], 10, 64)
		total += time.Duration(ut+st) * time.Second / 100 // USER_HZ
	}
	return total
}

// --- the farm ---------------------------------------------------------------

// fleetFarm is a benchFarm whose server is elsewhere: its connections dial
// every URL and reconnect.
type fleetFarm struct {
	*benchFarm
	urls string
	// ready is how long the agents took from their start to every slot's
	// pull waiting.
	ready time.Duration
}

func (f *fleetFarm) connect() (*nats.Conn, jetstream.JetStream) {
	return natstest.Dial(f.tb, f.urls, nats.MaxReconnects(-1))
}

// newFleetFarm starts the controller and agents real agents of one slot
// with the default config, each on its own connection.
func newFleetFarm(tb testing.TB, bus *natsProcs, cat *mesh.Catalogue, cfg cascade.Config, agents int) (*fleetFarm, *fetchWarnings) {
	tb.Helper()
	f := &fleetFarm{benchFarm: &benchFarm{tb: tb, work: &sleeper{}, slots: agents, shards: cat.BuildShards()}, urls: bus.urls}
	f.work.dur.Store(&map[string]time.Duration{})
	tb.Cleanup(f.Close)
	var tnc *nats.Conn
	tnc, f.js = f.connect()
	f.stops = append(f.stops, tnc.Close)

	nc, cjs := f.connect()
	f.startController(nc, cjs, cat, cfg, 60*time.Second, 20*time.Millisecond)
	warns := &fetchWarnings{}
	began := time.Now()
	// Each machine's pulls wait what the fleet's size wants (the server
	// walks every waiting pull at each expiry and heartbeat).
	wait := mesh.FleetSettingsOf(mesh.Fleet{Machines: agents, Slots: 1}).FetchWait
	f.startAgents(f.connect, agents, slog.New(warns), func(i int, acfg *agent.Config) {
		acfg.Machine = fmt.Sprintf("sim-%04d", i+1)
		acfg.FetchWait = wait
	})
	f.ready = f.waitFleetIdle(30*time.Second+time.Duration(agents)*10*time.Millisecond, warns).Sub(began)
	return f, warns
}

// waitFleetIdle is waitIdle for a fleet starting: every agent connects,
// claims its machine's seat and binds before its pull waits, which takes
// longer than waitIdle's 30s at 10,000 agents. It returns when the last
// pull was seen waiting.
func (f *fleetFarm) waitFleetIdle(timeout time.Duration, warns *fetchWarnings) time.Time {
	f.tb.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	waiting, looked := 0, 0
	var lastErr error
	for time.Now().Before(deadline) {
		l, err := seatLook(ctx, f.js, f.shards)
		if err == nil {
			looked++
			waiting = l.Waiting
			if waiting >= f.slots && l.Pending == 0 && l.AckPending == 0 {
				return time.Now()
			}
		}
		if err != nil {
			lastErr = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	n, sample := warns.fetchErrors()
	f.tb.Fatalf("%d of the %d slots have a pull waiting after %s (the consumer's info read %d times; last error: %v); the agents logged %d errors, e.g. %s", waiting, f.slots, timeout, looked, lastErr, n, sample)
	return time.Time{}
}

// fleetDispatch publishes n asks one at a time to idle agents and returns
// the publish → claimed latencies (meshtest.Claims), sorted; each ask's
// built is awaited before the next is published.
func fleetDispatch(tb testing.TB, f *fleetFarm, nc *nats.Conn, n int) []time.Duration {
	tb.Helper()
	claims := meshtest.WatchClaims(tb, f.js)
	defer claims.Stop() // not to cost the throughput phase
	builtc := make(chan string, 1)
	var want atomic.Pointer[string]
	sub, err := nc.Subscribe(mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventBuilt), func(m *nats.Msg) {
		if w := want.Load(); w != nil && strings.Contains(string(m.Data), `"`+*w+`"`) {
			select {
			case builtc <- *w:
			default:
			}
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	f.work.dur.Store(&map[string]time.Duration{})
	var lat []time.Duration
	for i := range n {
		id := fmt.Sprintf("dispatch-%d", i)
		want.Store(&id)
		a := mesh.Ask{Version: mesh.AskVersion, ID: id, Plan: "p-dispatch", Module: "dispatch",
			Source: mesh.Source{Repo: "https://git.example/x.git", Commit: "abc"}, Image: "127.0.0.1:1/dispatch"}
		data, err := json.Marshal(a)
		if err != nil {
			tb.Fatal(err)
		}
		t0 := time.Now()
		// Every shard has machines idle: one ask at a time, each to the
		// next shard (the controller's routing, shardView.route, keeps a
		// shard while its machines are idle: the same for one ask).
		subj := mesh.BuildShardSubject(mesh.DefaultPlatform, i%max(f.shards, 1))
		if _, err := f.js.Publish(context.Background(), subj, data, jetstream.WithMsgID(id)); err != nil {
			tb.Fatal(err)
		}
		lat = append(lat, claims.Wait(tb, id, 30*time.Second).Sub(t0))
		select {
		case <-builtc:
		case <-time.After(30 * time.Second):
			tb.Fatalf("ask %s: not built within 30s", id)
		}
	}
	slices.Sort(lat)
	return lat
}

// fetchWarnings is the agents' logger: it counts what they log about a
// pull that failed or ended in an error (a 409 Exceeded MaxWaiting among
// them), and an agent that stopped with an error.
type fetchWarnings struct {
	mu     sync.Mutex
	n      int
	sample string
}

func (w *fetchWarnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *fetchWarnings) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, "fetch") && r.Message != "agent stopped" {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n++
	if w.sample == "" {
		w.sample = r.Message
		r.Attrs(func(a slog.Attr) bool {
			w.sample += " " + a.String()
			return true
		})
	}
	return nil
}
func (w *fetchWarnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *fetchWarnings) WithGroup(string) slog.Handler      { return w }

func (w *fetchWarnings) fetchErrors() (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, w.sample
}

// busyWindow is how long fleetBusy measures the fleet idle, then building,
// in make bench.
const busyWindow = 5 * time.Second

// fleetBusy measures what builds in hand cost the server beside plan
// progress: each one's ask claim renewed every third of its lease and its
// heartbeat (InProgress) every third of the ack wait, which no throughput
// figure sees (their builds take no time). The server's CPU and messages
// over window with the fleet idle, then with every build of a plan's first
// tier in hand (builds of 4 windows, the other modules none):
// their difference, per build in hand, and what 10,000 builds in hand
// would cost at that rate. The agents hold no seat claim here (a seat
// claim is renewed every third of --lease, 5 s by default, idle or not).
func fleetBusy(tb testing.TB, f *fleetFarm, bus *natsProcs, d sim.DAG, busyWindow time.Duration) map[string]float64 {
	long := d
	long.Dur = make([]float64, d.Len())
	first := 0
	for i := range d.Len() {
		if len(d.Bases[i]) == 0 {
			long.Dur[i], first = 4, first+1
		}
	}
	window := func() (time.Duration, float64) {
		cpu0, ops0 := bus.cpu(), bus.ops(tb)
		time.Sleep(busyWindow)
		return bus.cpu() - cpu0, bus.ops(tb).In - ops0.In
	}
	f.waitIdle()
	time.Sleep(time.Second) // the last plan's stores after its settle
	idleCPU, idleIn := window()
	type sample struct {
		cpu  time.Duration
		in   float64
		held int
		err  error
	}
	got := make(chan sample, 1)
	go func() {
		ctx := context.Background()
		deadline := time.Now().Add(3 * busyWindow)
		for {
			l, err := seatLook(ctx, f.js, f.shards)
			if err == nil && l.AckPending >= first {
				break
			}
			if time.Now().After(deadline) {
				got <- sample{err: fmt.Errorf("%d of the first tier's %d builds in hand after %s (%v)", l.AckPending, first, 3*busyWindow, err)}
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The builds' started events (after the agents' --started-delay) and
		// their stores are over; claims and heartbeats are in their rhythm.
		time.Sleep(max(busyWindow/5, time.Second))
		cpu, in := window()
		l, err := seatLook(ctx, f.js, f.shards)
		got <- sample{cpu: cpu, in: in, held: l.AckPending, err: err}
	}()
	f.run(long, busyWindow, 10*time.Minute)
	b := <-got
	if b.err != nil {
		tb.Fatalf("measuring the fleet busy: %v", b.err)
	}
	if b.held < first {
		tb.Fatalf("measuring the fleet busy: %d of %d builds still in hand at the window's end", b.held, first)
	}
	perCPU := (b.cpu - idleCPU).Seconds() / busyWindow.Seconds() / float64(first)
	perIn := (b.in - idleIn) / busyWindow.Seconds() / float64(first)
	return map[string]float64{
		"busy-builds":                float64(first),
		"busy-server-cores":          b.cpu.Seconds() / busyWindow.Seconds(),
		"idle-server-cores":          idleCPU.Seconds() / busyWindow.Seconds(),
		"busy-server-us-per-build":   1e6 * perCPU,
		"busy-server-msgs-per-build": perIn,
		"busy-10000-server-cores":    10000 * perCPU,
		"idle-server-msgs/s":         idleIn / busyWindow.Seconds(),
		"busy-server-msgs/s":         b.in / busyWindow.Seconds(),
	}
}
