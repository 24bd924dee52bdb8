package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/sim"
	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// The farm against `docker buildx bake`, side by side in one run, on a
// fleet whose builds take time in real steps: bakeFleet, sixteen modules
// four levels deep (the example fleet's base; three libraries on it; four
// modules on those; eight leaves on those), every Dockerfile with a RUN
// that sleeps, so that a build waits rather than takes the CPU. The farm is
// bakeMachines agents, each with a buildkitd of its own of max-parallelism
// 1 (one step at a time, its own state), sharing the farm's registry; bake
// is one buildkitd of max-parallelism bakeMachines, through buildx's remote
// driver, the bake file generated from the catalogue (bakeFile), pushing to
// the same registry. Three figures, each the median of bakeRuns:
//
//   - cold: a new base version (the base's motd changed and committed),
//     every step after it run again. The farm: the push announced as
//     mesh-git would, from the plan made to it settled; its first run is a
//     fresh farm (first sight: no build durations known), the later ones
//     know the durations of the last. Bake: the same change in its sources,
//     the bake from start to end; its first run is a fresh daemon.
//   - forced, every step cached: the farm's `builds rebuild --force` of
//     every module (each built again, every step from the cache), from the
//     request to the plan seen settled; bake of the unchanged sources
//     (every step cached: bake always rebuilds from its cache).
//   - nothing changed: `builds rebuild` of every module (not --force: all
//     unchanged, nothing dispatched), from the request to the plan seen
//     settled, against the same bake.
//
// MESHBUILD_BENCH=tiny (`make test`): no sleeps, one run of each on the
// farm, the bake half skipped (it may build buildx first), with a logged
// reason.
//
//	MESHBUILD_BUILDKIT=1 go test -run XXX -bench BenchmarkFleetBake -benchtime 1x ./internal/demo

const (
	bakeMachines = 3
	bakeRuns     = 3
)

// bakeLevels are bakeFleet's levels below the base: a name prefix, how
// many, how long each build's RUN sleeps. Module i of a level is built on
// module i mod n of the level before.
var bakeLevels = []struct {
	prefix string
	n      int
	sleep  time.Duration
}{
	{"lib", 3, 300 * time.Millisecond},
	{"mid", 4, 800 * time.Millisecond},
	{"leaf", 8, 2300 * time.Millisecond},
}

// bakeBaseSleep is the base's RUN.
const bakeBaseSleep = 500 * time.Millisecond

// bakeFleet writes the fleet's catalogue and sources under dir: the
// example fleet's base (its Dockerfile and files, with a RUN that sleeps
// appended) and the modules of bakeLevels, each FROM its base by module
// name, copying a file of its own and sleeping in a RUN; the catalogue
// holds the example fleet's manifests of the mesh's own modules (the
// agent, the controller, git) beside theirs. With sleeps false every RUN
// is `true`. It returns the catalogue and source directories and the
// modules built.
func bakeFleet(tb testing.TB, example, dir string, sleeps bool) (catalogue, src string, modules []string) {
	tb.Helper()
	catalogue, src = filepath.Join(dir, "catalogue"), filepath.Join(dir, "src")
	for _, d := range []string{catalogue, src} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	for _, own := range []string{"build-agent.yaml", "build-controller.yaml", "git.yaml"} {
		data, err := os.ReadFile(filepath.Join(example, "catalogue", own))
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(catalogue, own), data, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	if err := copyTree(filepath.Join(example, "src", "base"), filepath.Join(src, "base")); err != nil {
		tb.Fatal(err)
	}
	run := func(d time.Duration) string {
		if !sleeps {
			return "RUN true\n"
		}
		return fmt.Sprintf("RUN sleep %.1f\n", d.Seconds())
	}
	write := func(path, data string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	df, err := os.ReadFile(filepath.Join(src, "base", "Dockerfile"))
	if err != nil {
		tb.Fatal(err)
	}
	write(filepath.Join(src, "base", "Dockerfile"), string(df)+"\n# Added by BenchmarkFleetBake: a step that takes time, not CPU.\n"+run(bakeBaseSleep))
	data, err := os.ReadFile(filepath.Join(example, "catalogue", "base.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	write(filepath.Join(catalogue, "base.yaml"), string(data))
	modules = []string{"base"}
	below := []string{"base"}
	for _, l := range bakeLevels {
		var level []string
		for i := range l.n {
			name := fmt.Sprintf("%s-%d", l.prefix, i+1)
			on := below[i%len(below)]
			write(filepath.Join(catalogue, name+".yaml"), fmt.Sprintf("module: %s\nbuild:\n  repo: %s\n  path: %s\n  on: [%s]\n", name, Remote, name, on))
			write(filepath.Join(src, name, name+".txt"), name+"\n")
			write(filepath.Join(src, name, "Dockerfile"), fmt.Sprintf("# %s: built on %s by BenchmarkFleetBake.\nFROM %s\nCOPY %s.txt /srv/%s.txt\n%s", name, on, on, name, name, run(l.sleep)))
			level = append(level, name)
		}
		modules = append(modules, level...)
		below = level
	}
	slices.Sort(modules)
	return catalogue, src, modules
}

// bakeSleep is how long module's RUN sleeps in bakeFleet (0 without
// sleeps).
func bakeSleep(module string, sleeps bool) time.Duration {
	if !sleeps {
		return 0
	}
	if module == "base" {
		return bakeBaseSleep
	}
	for _, l := range bakeLevels {
		if strings.HasPrefix(module, l.prefix+"-") {
			return l.sleep
		}
	}
	return 0
}

func BenchmarkFleetBake(b *testing.B) {
	testenv.RequireBuildkit(b)
	tiny, runs := os.Getenv("MESHBUILD_BENCH") == "tiny", bakeRuns
	if tiny {
		runs = 1
	}
	catalogue, src, modules := bakeFleet(b, testenv.ExampleFleet(b), b.TempDir(), !tiny)
	cat, problems, err := mesh.Load(catalogue)
	if err != nil || len(problems) > 0 {
		b.Fatalf("catalogue %s: %v %v", catalogue, err, problems)
	}

	f, state, stop := upBenchFarm(b, catalogue, bakeMachines, 1)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*fleetTimeout)
	defer cancel()
	repo := Repo(state)

	var farmCold, farmForced, farmNothing []time.Duration
	var firstSight time.Duration
	// coldRuns are the cold runs after the first, with their modules.
	var coldRuns []fleetRun
	n := 0
	for b.Loop() {
		// Cold, first sight: a fresh farm, the demo's push (the sources
		// committed, the base's motd changed).
		var out bytes.Buffer
		if err := Run(ctx, f, src, &out); err != nil {
			b.Fatalf("the first cold build: %v\n%s", err, out.String())
		}
		conn, js, store := operatorStore(b, ctx, f, "BenchmarkFleetBake")
		defer conn.Close()
		first := onlyPlan(b, ctx, store, "the first cold build's one")
		firstSight = first.Finished.Sub(first.Created)
		farmCold = append(farmCold, firstSight)
		if os.Getenv("MESHBUILD_BAKE_TIMELINE") != "" {
			logTimeline(b, ctx, js, store, first.ID, first.Created)
		}
		// Cold again: a new base version each time, the durations known.
		for range runs - 1 {
			commit, paths, err := changeBase(ctx, repo)
			if err != nil {
				b.Fatal(err)
			}
			id, _, err := cascade.Push(ctx, js, mesh.Pushed{Repo: Remote, Ref: "refs/heads/main", Commit: commit, Paths: paths})
			if err != nil {
				b.Fatal(err)
			}
			_, rec, mods := settled(b, ctx, store, id)
			if rec.Counts.Built != len(modules) {
				b.Fatalf("a new base version: %+v; want all %d modules built", rec.Counts, len(modules))
			}
			for name, m := range mods {
				if sleep := bakeSleep(name, !tiny); m.Duration < sleep {
					b.Errorf("a new base version: %s built in %s, less than its sleep of %s: a step came from a cache", name, m.Duration, sleep)
				}
			}
			farmCold = append(farmCold, rec.Finished.Sub(rec.Created))
			if os.Getenv("MESHBUILD_BAKE_TIMELINE") != "" {
				logTimeline(b, ctx, js, store, id, rec.Created)
			}
			coldRuns = append(coldRuns, fleetRun{makespan: rec.Finished.Sub(rec.Created), mods: mods})
		}
		for range runs {
			n++
			// Forced: every module built again, every step cached.
			t0 := time.Now()
			r, err := cascade.Call(ctx, conn, "build-controller", cascade.ToolRebuild, cascade.Request{ID: fmt.Sprintf("bench-forced-%d", n), Modules: modules, Force: true})
			if err != nil {
				b.Fatalf("rebuild --force: %v", err)
			}
			at, rec, _ := settled(b, ctx, store, r.Plan)
			if rec.Counts.Built != len(modules) {
				b.Fatalf("a forced rebuild: %+v; want all %d modules built", rec.Counts, len(modules))
			}
			farmForced = append(farmForced, at.Sub(t0))
			if os.Getenv("MESHBUILD_BAKE_TIMELINE") != "" {
				logTimeline(b, ctx, js, store, r.Plan, t0)
			}

			// Nothing changed: every module rebuilt, none dispatched.
			farmNothing = append(farmNothing, rebuildNothing(b, ctx, conn, store, modules, n))
		}
	}
	med := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	b.ReportMetric(med(farmCold).Seconds(), "cold-farm-s")
	b.ReportMetric(firstSight.Seconds(), "cold-first-sight-farm-s")
	b.ReportMetric(med(farmForced).Seconds(), "forced-farm-s")
	b.ReportMetric(med(farmNothing).Seconds(), "nothing-farm-s")
	b.ReportMetric(float64(len(modules)), "modules")
	b.ReportMetric(float64(runs), "runs")
	// Where a cold run's time goes (the cold runs after the first, means):
	// each build's time beyond its sleep, and the run against list
	// scheduling of its own builds' durations on the machines (sim): the
	// hand-overs and the order, not the builds.
	if len(coldRuns) > 0 {
		var over, beyond float64
		builds := 0
		for _, r := range coldRuns {
			d := r.dag()
			over += r.makespan.Seconds() - sim.Simulate(d, bakeMachines, sim.Policy{Order: sim.Priority}).Makespan
			for name, m := range r.mods {
				beyond += (m.Duration - bakeSleep(name, !tiny)).Seconds()
				builds++
			}
		}
		b.ReportMetric(over/float64(len(coldRuns)), "cold-over-list-s")
		b.ReportMetric(beyond/float64(builds), "cold-build-beyond-sleep-s")
	}
	b.ReportMetric(bakeMachines, "machines")
	if tiny {
		b.Logf("MESHBUILD_BENCH=tiny: the bake half is skipped (it may build buildx %s from the Go module proxy first); the farm half ran", BuildxVersion)
		return
	}

	// Bake: its own copy of the sources, the same changes to the base.
	bakeSrc := b.TempDir()
	if err := copyTree(src, bakeSrc); err != nil {
		b.Fatal(err)
	}
	bakePath := filepath.Join(b.TempDir(), "docker-bake.json")
	data, err := bakeFile(cat, bakeSrc, f.RegistryAddr()+"/bake")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(bakePath, data, 0o644); err != nil {
		b.Fatal(err)
	}
	daemonAddr := testenv.BuildkitdWith(b, buildkitd.Options{RegistryHosts: []string{f.RegistryAddr()}, MaxParallelism: bakeMachines})
	bake := newBaker(b, buildxBin(b), daemonAddr, bakeSrc)
	var bakeCold, bakeWarm []time.Duration
	var bakeFirst time.Duration
	for i := range runs {
		// The base's busybox is the farm's (commitSources adds it).
		if i == 0 {
			bin, err := os.ReadFile(filepath.Join(repo, "base", "busybox"))
			if err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(bakeSrc, "base", "busybox"), bin, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		motd := filepath.Join(bakeSrc, "base", "motd")
		old, err := os.ReadFile(motd)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(motd, append(old, fmt.Sprintf("a new base version for bake, %d, %s\n", i, time.Now().UTC().Format(time.RFC3339Nano))...), 0o644); err != nil {
			b.Fatal(err)
		}
		d := bake(bakePath)
		if i == 0 {
			bakeFirst = d
		}
		bakeCold = append(bakeCold, d)
	}
	for range runs {
		bakeWarm = append(bakeWarm, bake(bakePath))
	}
	b.ReportMetric(med(bakeCold).Seconds(), "cold-bake-s")
	b.ReportMetric(bakeFirst.Seconds(), "cold-first-bake-s")
	b.ReportMetric(med(bakeWarm).Seconds(), "warm-bake-s")
	b.ReportMetric(float64(med(farmCold))/float64(med(bakeCold)), "cold-farm/bake")
	b.ReportMetric(float64(med(farmForced))/float64(med(bakeWarm)), "forced-farm/bake")
	b.ReportMetric(float64(med(farmNothing))/float64(med(bakeWarm)), "nothing-farm/bake")
	if testing.Verbose() {
		b.Logf("farm cold %v, forced %v, nothing %v; bake cold %v, warm %v", farmCold, farmForced, farmNothing, bakeCold, bakeWarm)
	}
}

// logTimeline logs when each module of plan was queued, started and
// finished, from t0, by start: a diagnostic of where a plan's time goes
// (MESHBUILD_BAKE_TIMELINE=1).
func logTimeline(b *testing.B, ctx context.Context, js jetstream.JetStream, store *cascade.Store, plan string, t0 time.Time) {
	mods, err := store.Modules(ctx, plan)
	if err != nil {
		b.Fatal(err)
	}
	names := slices.Sorted(maps.Keys(mods))
	slices.SortFunc(names, func(x, y string) int { return mods[x].Started.Compare(mods[y].Started) })
	var sb strings.Builder
	for _, n := range names {
		m := mods[n]
		fmt.Fprintf(&sb, "\n  %-10s tier %d  queued %5.0f  started %5.0f  finished %5.0f ms  (%4.0f ms on %s)  %s", n, m.Tier,
			ms(m.Queued.Sub(t0)), ms(m.Started.Sub(t0)), ms(m.Finished.Sub(t0)), ms(m.Duration), m.On, tookLine(ctx, js, m.Ask))
	}
	b.Logf("plan %s:%s", plan, sb.String())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// tookLine is the "took: …" line of ask's build output (its spans), or "".
func tookLine(ctx context.Context, js jetstream.JetStream, ask string) string {
	if ask == "" {
		return ""
	}
	subj := mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.LogEvent(ask))
	cons, err := js.OrderedConsumer(ctx, mesh.LogsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return ""
	}
	took := ""
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(300 * time.Millisecond))
		if err != nil {
			return took
		}
		var batch mesh.LogBatch
		if json.Unmarshal(msg.Data(), &batch) != nil {
			continue
		}
		for _, l := range batch.Lines {
			if strings.HasPrefix(l, "took: ") {
				took = l
			}
		}
		if batch.Final {
			return took
		}
	}
}
