package demo

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/sim"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// The fleet against one machine: examples/fleet built by the embedded
// farm with real BuildKit on K simulated machines — K agents, each with a
// buildkitd of its own running one step at a time (max-parallelism 1) —
// against the same plan on one such machine. Every module's Dockerfile
// gets a step that sleeps fleetSleep, so that builds take time without
// taking the CPU: this machine's 2 cores would otherwise decide the result.
//
// Each run is a fresh farm (state, registry, buildkitds): every build is
// cold, in both. The makespan runs from the controller making the plan of
// Run's push to the plan settling. Beside speedup ÷ K (1 is perfect) it
// reports, with the build times measured on one machine, what list
// scheduling longest path first gives that DAG (sim.Simulate, Priority: a
// heuristic, not the optimum, which 39 modules are too many to search
// for) and the bound no schedule beats (sim.TightBound: the base is built
// alone, then runtime and static, then 36 modules share the K machines).
//
// MESHBUILD_BENCH=tiny (`make test`): 3 of the 35 tools (7 modules), no
// sleep, K = 2 only.
//
//	MESHBUILD_BUILDKIT=1 go test -run XXX -bench BenchmarkFleetSpeedup -benchtime 1x ./internal/demo

// fleetSleep is the step each module's Dockerfile gets.
const fleetSleep = time.Second

// fleetTimeout bounds one plan.
const fleetTimeout = 5 * time.Minute

func BenchmarkFleetSpeedup(b *testing.B) {
	testenv.RequireBuildkit(b)
	fleet := testenv.ExampleFleet(b)
	catalogue := filepath.Join(fleet, "catalogue")
	sleep, ks := fleetSleep, []int{2, 4}
	src, modules := sleepingFleet(b, filepath.Join(fleet, "src"), fleetSleep)
	if os.Getenv("MESHBUILD_BENCH") == "tiny" {
		sleep, ks = 0, []int{2}
		catalogue, src, modules = smallFleet(b, catalogue, filepath.Join(fleet, "src"), 3)
	}

	one := runFleet(b, catalogue, src, 1, modules, sleep)
	d := one.dag()
	b.Logf("one machine: %d modules in %.1f s, builds %.1f s in all", d.Len(), one.makespan.Seconds(), d.Work())

	for _, k := range ks {
		b.Run(fmt.Sprintf("K=%d", k), func(b *testing.B) {
			var r fleetRun
			for b.Loop() {
				r = runFleet(b, catalogue, src, k, modules, sleep)
			}
			dk := r.dag()
			speedup := one.makespan.Seconds() / r.makespan.Seconds()
			list := d.Work() / sim.Simulate(d, k, sim.Policy{Order: sim.Priority}).Makespan
			bound := d.Work() / sim.TightBound(d, k)
			// The controller's policy with the default window runFleet
			// runs (WindowIdle): a released ask is held until a holder is
			// idle, the longest remaining path first — in modules, since a
			// fresh farm knows no durations.
			controller := sim.Policy{Order: sim.Priority, UnitEstimates: true}
			policy := d.Work() / sim.Simulate(d, k, controller).Makespan
			b.Logf("%d machines: %.1f s, builds %.1f s in all (one machine: %.1f s, %.1f s); speed-up %.2f, list schedule %.2f, bound %.2f",
				k, r.makespan.Seconds(), dk.Work(), one.makespan.Seconds(), d.Work(), speedup, list, bound)
			b.ReportMetric(speedup, "speedup")
			b.ReportMetric(speedup/float64(k), "speedup/K")
			b.ReportMetric(list/float64(k), "list-speedup/K")
			b.ReportMetric(bound/float64(k), "bound-speedup/K")
			b.ReportMetric(policy/float64(k), "sim-cascade-speedup/K")
			b.ReportMetric(one.makespan.Seconds(), "one-machine-s")
			b.ReportMetric(r.makespan.Seconds(), "makespan-s")
			b.ReportMetric(d.Work()/float64(d.Len()), "one-build-s")
			b.ReportMetric(dk.Work()/float64(dk.Len()), "build-s")
			// How much longer the run took than the controller's policy
			// would with the same builds' durations: hand-overs, not
			// slower builds.
			b.ReportMetric(r.makespan.Seconds()-sim.Simulate(dk, k, controller).Makespan, "over-sim-s")
		})
	}
}

// sleepingFleet copies the fleet's sources to a temporary directory and
// adds a step that sleeps d to every Dockerfile. It returns the copy and
// the modules (the directories holding a Dockerfile).
func sleepingFleet(tb testing.TB, src string, d time.Duration) (string, int) {
	tb.Helper()
	dst := tb.TempDir()
	if err := copyTree(src, dst); err != nil {
		tb.Fatal(err)
	}
	step := fmt.Sprintf("\n# Added by BenchmarkFleetSpeedup: a step that takes time, not CPU.\nRUN sleep %d\n", int(d.Seconds()))
	n := 0
	err := filepath.WalkDir(dst, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.Name() != "Dockerfile" || !e.Type().IsRegular() {
			return err
		}
		f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		n++
		if _, err := f.WriteString(step); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
	if err != nil {
		tb.Fatalf("adding the sleep to %s: %v", dst, err)
	}
	if n == 0 {
		tb.Fatalf("no Dockerfile under %s", src)
	}
	return dst, n
}

// smallFleet copies the fleet's catalogue and sources, keeping only the
// first tools of the 35 (tools/tool-NN, tool-NN.yaml), and returns the
// copies and the modules left.
func smallFleet(tb testing.TB, catalogue, src string, tools int) (string, string, int) {
	tb.Helper()
	cat, dst := tb.TempDir(), tb.TempDir()
	if err := copyTree(catalogue, cat); err != nil {
		tb.Fatal(err)
	}
	if err := copyTree(src, dst); err != nil {
		tb.Fatal(err)
	}
	for i := tools + 1; ; i++ {
		name := fmt.Sprintf("tool-%02d", i)
		if _, err := os.Stat(filepath.Join(dst, "tools", name)); err != nil {
			break
		}
		if err := os.RemoveAll(filepath.Join(dst, "tools", name)); err != nil {
			tb.Fatal(err)
		}
		if err := os.Remove(filepath.Join(cat, name+".yaml")); err != nil {
			tb.Fatal(err)
		}
	}
	// Copy again with no sleep: what is left is what gets built.
	src, modules := sleepingFleet(tb, dst, 0)
	return cat, src, modules
}

// fleetRun is one plan of the fleet.
type fleetRun struct {
	makespan time.Duration
	mods     map[string]cascade.ModuleStatus
}

// dag is the plan's graph with each module's build duration in seconds.
func (r fleetRun) dag() sim.DAG {
	names := make([]string, 0, len(r.mods))
	for name := range r.mods {
		names = append(names, name)
	}
	slices.Sort(names)
	pos := make(map[string]int, len(names))
	for i, name := range names {
		pos[name] = i
	}
	d := sim.DAG{Names: names, Bases: make([][]int, len(names)), Dur: make([]float64, len(names))}
	for i, name := range names {
		m := r.mods[name]
		for _, base := range m.Bases {
			d.Bases[i] = append(d.Bases[i], pos[base])
		}
		d.Dur[i] = m.Duration.Seconds()
	}
	return d
}

// runFleet starts a fresh farm of the given machines, each with its own
// buildkitd of max-parallelism 1, builds the fleet in src with Run and
// requires all the modules built.
func runFleet(b *testing.B, catalogue, src string, machines, modules int, sleep time.Duration) fleetRun {
	b.Helper()
	f, _, stop := upBenchFarm(b, catalogue, machines, 1)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), fleetTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, f, src, &out); err != nil {
		b.Fatalf("Run on %d machines: %v\n%s", machines, err, out.String())
	}
	nc, _, store := operatorStore(b, ctx, f, "BenchmarkFleetSpeedup")
	defer nc.Close()
	rec := onlyPlan(b, ctx, store, "the demo's one")
	if rec.Outcome != cascade.OutcomeBuilt || rec.Counts.Built != modules {
		b.Fatalf("plan %s: %s, %+v; want all %d modules built", rec.ID, rec.Outcome, rec.Counts, modules)
	}
	mods, err := store.Modules(ctx, rec.ID)
	if err != nil {
		b.Fatal(err)
	}
	used := map[string]int{}
	for _, m := range mods {
		used[m.On]++
	}
	if len(used) != machines {
		b.Errorf("the plan was built on %v; want all %d machines used", used, machines)
	}
	// The sleep ran in every build: no step came from a cache.
	for _, m := range mods {
		if m.Duration < sleep {
			b.Errorf("%s built in %s, less than its sleep of %s", m.Module, m.Duration, sleep)
		}
	}
	if testing.Verbose() {
		b.Logf("%d machines:\n%s", machines, strings.TrimSpace(out.String()))
	}
	return fleetRun{makespan: rec.Finished.Sub(rec.Created), mods: mods}
}
