package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/nats-io/nats.go"
)

// A rebuild that changes nothing, and a change that changes no image, on
// the embedded farm (rebuildMachines agents, each with a buildkitd of its
// own, one slot each, the farm's registry shared), side by side with
// `docker buildx bake` of the same targets on one buildkitd.
//
// The catalogue is examples/fleet, or the directory MESHBUILD_BENCH_FLEET
// names: one laid out like it, with the manifests in catalogue/ and the
// sources in src/ (src/base/Dockerfile among them: demo.Run builds it
// first, with a static busybox beside it).
//
//   - The fleet is built cold once (demo.Run), unmeasured.
//   - Nothing changed: `builds rebuild` of every built module, not
//     --force — every input key was built, so the plan settles with every
//     module unchanged and nothing dispatched. Its time, from the request
//     to a watch of the plan's record seeing it settled, is divided by a warm `buildx bake` of every
//     target (the bake file generated from the catalogue: a target per
//     module, its build.on as contexts = { base = "target:base" }), on a
//     buildkitd of its own that has baked them once, pushing to the same
//     registry: every step cached there too. Medians of rebuildRuns each.
//   - A change to a file the base's Dockerfile never copies (a note
//     committed in its build context, pushed as mesh-git would): the base
//     is built — every step cached, the digest it had — and everything on
//     it settles unchanged (early cutoff). Its time, from the push
//     announced to the plan seen settled, over the base's build in that
//     plan (its agent's whole work on it): how much of the plan is not the
//     one build.
//
// MESHBUILD_BENCH=tiny (`make test`): 3 of the tools, one run of each, and
// the bake half is skipped (it builds buildx from the module proxy first),
// with a logged reason; the farm half runs and checks itself.
//
//	MESHBUILD_BUILDKIT=1 go test -run XXX -bench BenchmarkFleetRebuild -benchtime 1x ./internal/demo

const (
	rebuildMachines = 3
	rebuildRuns     = 5
	// BuildxVersion is the buildx the bake half builds and runs.
	BuildxVersion = "v0.38.2"
)

func BenchmarkFleetRebuild(b *testing.B) {
	testenv.RequireBuildkit(b)
	fleet := os.Getenv("MESHBUILD_BENCH_FLEET")
	if fleet == "" {
		fleet = testenv.ExampleFleet(b)
	}
	catalogue, src := filepath.Join(fleet, "catalogue"), filepath.Join(fleet, "src")
	tiny, runs := os.Getenv("MESHBUILD_BENCH") == "tiny", rebuildRuns
	if tiny {
		runs = 1
		catalogue, src, _ = smallFleet(b, catalogue, src, 3)
	}
	cat, problems, err := mesh.Load(catalogue)
	if err != nil || len(problems) > 0 {
		b.Fatalf("catalogue %s: %v %v", catalogue, err, problems)
	}
	var modules []string
	for _, m := range cat.Built() {
		modules = append(modules, m.Module)
	}
	slices.Sort(modules)
	base := mostBuiltOn(cat)

	f, state, stop := upBenchFarm(b, catalogue, rebuildMachines, 0)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*fleetTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, f, src, &out); err != nil {
		b.Fatalf("the cold build: %v\n%s", err, out.String())
	}
	nc, js, store := operatorStore(b, ctx, f, "BenchmarkFleetRebuild")
	defer nc.Close()
	coldMods, err := store.Modules(ctx, onlyPlan(b, ctx, store, "the cold build's one").ID)
	if err != nil {
		b.Fatal(err)
	}
	repo := Repo(state)

	var nothing, change, baseBuild []time.Duration
	n := 0
	for b.Loop() {
		for range runs {
			n++
			// Nothing changed: every module rebuilt, none dispatched.
			nothing = append(nothing, rebuildNothing(b, ctx, nc, store, modules, n))

			// A note in the base's context, which its Dockerfile never copies.
			commit, paths := commitNote(b, ctx, repo, cat, base, n)
			t0 := time.Now()
			id, _, err := cascade.Push(ctx, js, mesh.Pushed{Repo: Remote, Ref: "refs/heads/main", Commit: commit, Paths: paths})
			if err != nil {
				b.Fatal(err)
			}
			at, rec, mods := settled(b, ctx, store, id)
			if rec.Counts.Built != 1 || mods[base].State != cascade.Built || rec.Counts.Unchanged != rec.Counts.Total-1 {
				b.Fatalf("a change no image copies: %+v, %s %s; want %s built, the other %d unchanged", rec.Counts, base, mods[base].State, base, rec.Counts.Total-1)
			}
			if mods[base].Digest != coldMods[base].Digest {
				b.Fatalf("%s built to %s; want the digest it had, %s", base, mods[base].Digest, coldMods[base].Digest)
			}
			change = append(change, at.Sub(t0))
			baseBuild = append(baseBuild, mods[base].Duration)
		}
	}
	med := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	b.ReportMetric(med(nothing).Seconds()*1000, "nothing-farm-ms")
	b.ReportMetric(med(change).Seconds()*1000, "change-farm-ms")
	b.ReportMetric(med(baseBuild).Seconds()*1000, "change-base-build-ms")
	b.ReportMetric(coldMods[base].Duration.Seconds()*1000, "cold-base-build-ms")
	b.ReportMetric(float64(med(change))/float64(med(baseBuild)), "change/base-build")
	b.ReportMetric(float64(len(modules)), "modules")
	b.ReportMetric(float64(runs), "runs")

	if tiny {
		b.Logf("MESHBUILD_BENCH=tiny: the bake half is skipped (it builds buildx %s from the Go module proxy first); the farm half ran", BuildxVersion)
		return
	}
	buildx := buildxBin(b)
	bakePath := filepath.Join(b.TempDir(), "docker-bake.json")
	data, err := bakeFile(cat, repo, f.RegistryAddr()+"/bake")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(bakePath, data, 0o644); err != nil {
		b.Fatal(err)
	}
	daemonAddr := testenv.BuildkitdWith(b, buildkitd.Options{RegistryHosts: []string{f.RegistryAddr()}})
	bake := newBaker(b, buildx, daemonAddr, repo)
	bake(bakePath) // cold, unmeasured
	var baked []time.Duration
	for range runs {
		baked = append(baked, bake(bakePath))
	}
	b.ReportMetric(med(baked).Seconds()*1000, "nothing-bake-ms")
	b.ReportMetric(float64(med(nothing))/float64(med(baked)), "nothing-farm/bake")
}

// settled waits, on a watch of its record, for a plan to settle and returns
// when it saw it settled, its record and its modules.
// rebuildNothing asks for the n-th rebuild of modules that changed nothing
// (not --force: bench-nothing-n) and returns the time from the request to
// the plan seen settled, every module unchanged.
func rebuildNothing(b *testing.B, ctx context.Context, nc *nats.Conn, store *cascade.Store, modules []string, n int) time.Duration {
	b.Helper()
	t0 := time.Now()
	r, err := cascade.Call(ctx, nc, "build-controller", cascade.ToolRebuild, cascade.Request{ID: fmt.Sprintf("bench-nothing-%d", n), Modules: modules})
	if err != nil {
		b.Fatalf("rebuild: %v", err)
	}
	at, rec, _ := settled(b, ctx, store, r.Plan)
	if rec.Counts.Unchanged != len(modules) {
		b.Fatalf("rebuild of an unchanged fleet: %+v; want all %d modules unchanged", rec.Counts, len(modules))
	}
	return at.Sub(t0)
}

func settled(b *testing.B, ctx context.Context, store *cascade.Store, plan string) (time.Time, cascade.PlanRecord, map[string]cascade.ModuleStatus) {
	b.Helper()
	wctx, cancel := context.WithTimeout(ctx, fleetTimeout)
	defer cancel()
	w, err := store.KV().Watch(wctx, cascade.PlanKey(plan))
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	var rec cascade.PlanRecord
	for e := range w.Updates() {
		if e == nil {
			continue
		}
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			b.Fatalf("plan %s: %v", plan, err)
		}
		if rec.Outcome == cascade.OutcomeRunning {
			continue
		}
		at := time.Now()
		mods, err := store.Modules(ctx, plan)
		if err != nil {
			b.Fatal(err)
		}
		return at, rec, mods
	}
	b.Fatalf("plan %s did not settle within %s: %+v", plan, fleetTimeout, rec)
	return time.Time{}, rec, nil
}

// mostBuiltOn is the module the most modules are built on, directly or
// not (the first by name among equals): the base of the fleet.
func mostBuiltOn(cat *mesh.Catalogue) string {
	on := map[string][]string{}
	for _, m := range cat.Built() {
		on[m.Module] = m.Build.On
	}
	best, most := "", -1
	for _, m := range cat.Built() {
		n := 0
		for _, d := range cat.Built() {
			if d.Module != m.Module && builtOn(on, d.Module, m.Module) {
				n++
			}
		}
		if n > most || n == most && m.Module < best {
			best, most = m.Module, n
		}
	}
	return best
}

func builtOn(on map[string][]string, module, base string) bool {
	for _, b := range on[module] {
		if b == base || builtOn(on, b, base) {
			return true
		}
	}
	return false
}

// commitNote commits a note in module's build context and returns the
// commit and the paths it changed.
func commitNote(b *testing.B, ctx context.Context, repo string, cat *mesh.Catalogue, module string, n int) (string, []string) {
	b.Helper()
	m, _ := cat.Module(module)
	note := filepath.ToSlash(filepath.Join(m.Build.Path, "MESHBUILD-BENCH-NOTE.md"))
	body := fmt.Sprintf("A note no Dockerfile copies, written by BenchmarkFleetRebuild (%d, %s).\n", n, time.Now().UTC().Format(time.RFC3339Nano))
	if err := os.WriteFile(filepath.Join(repo, filepath.FromSlash(note)), []byte(body), 0o644); err != nil {
		b.Fatal(err)
	}
	if _, err := gitIn(ctx, repo, "add", note); err != nil {
		b.Fatal(err)
	}
	if _, err := gitIn(ctx, repo, "commit", "-q", "-m", "a note", "--", note); err != nil {
		b.Fatal(err)
	}
	commit, err := gitIn(ctx, repo, "rev-parse", "HEAD")
	if err != nil {
		b.Fatal(err)
	}
	return commit, []string{note}
}

// bakeFile is a bake file (docker-bake.json) of the catalogue's built
// modules, their sources in srcDir: a target per module, named after it,
// its build.path the context and its Dockerfile; each base in build.on a
// named context from its target (contexts = { base = "target:base" }), as
// the farm supplies it; each image pushed to repoPrefix/<module>. The
// default group is every target.
func bakeFile(cat *mesh.Catalogue, srcDir, repoPrefix string) ([]byte, error) {
	type target struct {
		Context    string            `json:"context"`
		Dockerfile string            `json:"dockerfile,omitempty"`
		Contexts   map[string]string `json:"contexts,omitempty"`
		Platforms  []string          `json:"platforms,omitempty"`
		Output     []string          `json:"output"`
	}
	file := struct {
		Group  map[string]map[string][]string `json:"group"`
		Target map[string]target              `json:"target"`
	}{Group: map[string]map[string][]string{"default": {"targets": nil}}, Target: map[string]target{}}
	for _, m := range cat.Built() {
		t := target{
			Context:    filepath.Join(srcDir, filepath.FromSlash(m.Build.Path)),
			Dockerfile: m.Build.Dockerfile,
			Platforms:  m.Build.Platforms,
			Output:     []string{"type=image,name=" + repoPrefix + "/" + m.Module + ",push=true,registry.insecure=true"},
		}
		for _, on := range m.Build.On {
			if t.Contexts == nil {
				t.Contexts = map[string]string{}
			}
			t.Contexts[on] = "target:" + on
		}
		file.Target[m.Module] = t
		file.Group["default"]["targets"] = append(file.Group["default"]["targets"], m.Module)
	}
	if len(file.Target) == 0 {
		return nil, fmt.Errorf("the catalogue builds no module")
	}
	slices.Sort(file.Group["default"]["targets"])
	return json.MarshalIndent(file, "", "  ")
}

// buildxBin is bin/buildx at BuildxVersion, built first if it is not
// there: in a throw-away module outside the repository (buildx would move
// meshbuild's BuildKit if it were in go.mod).
func buildxBin(b *testing.B) string {
	b.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "buildx")
	if out, err := exec.Command(bin, "version").Output(); err == nil && strings.Contains(string(out), BuildxVersion) {
		return bin
	}
	dir := b.TempDir()
	for _, args := range [][]string{
		{"go", "mod", "init", "buildx-for-bench"},
		{"go", "get", "github.com/docker/buildx/cmd/buildx@" + BuildxVersion},
		// The version buildx reports (what is checked above).
		{"go", "build", "-ldflags", "-X github.com/docker/buildx/version.Version=" + BuildxVersion, "-o", bin, "github.com/docker/buildx/cmd/buildx"},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("building buildx %s (%s): %v\n%s", BuildxVersion, strings.Join(args, " "), err, out)
		}
	}
	return bin
}

// newBaker makes a remote-driver builder for the buildkitd at addr (in a
// buildx config of its own) and returns a func that bakes a file with it,
// allowed to read the sources under src, and returns how long the bake
// took.
func newBaker(b *testing.B, buildx, addr, src string) func(file string) time.Duration {
	b.Helper()
	cfg := b.TempDir()
	env := append(os.Environ(), "BUILDX_CONFIG="+cfg, "DOCKER_CONFIG="+cfg)
	run := func(args ...string) ([]byte, error) {
		cmd := exec.Command(buildx, args...)
		cmd.Env = env
		return cmd.CombinedOutput()
	}
	if out, err := run("create", "--name", "meshbuild-bench", "--driver", "remote", addr); err != nil {
		b.Fatalf("buildx create: %v\n%s", err, out)
	}
	return func(file string) time.Duration {
		t0 := time.Now()
		out, err := run("bake", "--builder", "meshbuild-bench", "--allow", "fs.read="+src, "--progress", "plain", "-f", file)
		d := time.Since(t0)
		if err != nil {
			b.Fatalf("buildx bake: %v\n%s", err, out)
		}
		return d
	}
}
