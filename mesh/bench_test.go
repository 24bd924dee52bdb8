package mesh

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
)

// benchModules is the size of the benchmark catalogues.
const benchModules = 10_000

// benchCatalogue generates a clean catalogue of n modules shaped like a
// build farm's: nearly every module an image — two build.on chains 1000
// deep, a fan of 3000 modules built FROM one hub, the rest built FROM two or
// three earlier modules — every module emitting events, half of them
// consuming others' and the seats' (wildcards included), a fifth owning
// state and a fifth reading it, and a seat every 100 modules.
func benchCatalogue(n int) []*Manifest {
	name := benchName
	seat := func(i int) string { return fmt.Sprintf("seat-%05d", i) }
	// Modules past 5000 without a build, which nothing is built FROM.
	built := func(i int) bool { return i < 5000 || i%10 != 9 }
	// before picks a module before i, spread over all of them by k.
	before := func(i, k int) int {
		h := uint64(i)*0x9E3779B97F4A7C15 + uint64(k)*0xC2B2AE3D27D4EB4F
		return int((h >> 17) % uint64(i))
	}
	// builtBefore picks a built module before i.
	builtBefore := func(i, k int) int {
		j := before(i, k)
		for !built(j) {
			j--
		}
		return j
	}
	ms := make([]*Manifest, n)
	for i := range n {
		m := &Manifest{
			Module: name(i),
			Emits:  []string{"changed", "item.*"},
		}
		if i%10 == 0 {
			m.Serves = []string{"status"}
		}
		if i%100 == 0 {
			m.Seats = []Seat{{
				Seat:    seat(i),
				Scope:   ScopeNode,
				Accepts: []string{"work retain 3d", "drain"},
				Emits:   []string{"started", "done", "log.*"},
				Serves:  []string{"status"},
			}}
		}
		if i%250 == 1 {
			m.Holds = []string{"mesh-controller"}
		}
		if i%5 == 0 {
			m.State = []Bucket{{Name: "data", History: 5, TTL: "7d"}}
		}
		if i%5 == 1 {
			j := before(i, 3)
			m.Reads = []string{name(j-j%5) + ".data"}
		}
		if i%2 == 0 && i > 0 {
			j := before(i, 7)
			s := seat(i - i%100)
			if s == seat(i) {
				s = seat(i - 100)
			}
			m.Consumes = []string{name(j) + ".changed", name(j) + ".item.x", s + ".done", s + ".log.*", "mesh-git.pushed"}
			m.Uses = []string{s}
			if i%50 == 0 {
				m.Consumes = append(m.Consumes, "not-installed.anything")
			}
		}
		if built(i) {
			b := &Build{Repo: "https://git.example/fleet.git", Path: "modules/" + name(i)}
			switch {
			case i == 0 || i == 1000 || i == 2000:
				// roots of the chains and the hub
			case i < 2000:
				b.On = []string{name(i - 1)} // two chains 1000 deep
			case i <= 5000:
				b.On = []string{name(2000)} // the fan
			default:
				on := []string{}
				for k := range 2 + i%2 {
					if d := name(builtBefore(i, k)); !slices.Contains(on, d) {
						on = append(on, d)
					}
				}
				b.On = on
			}
			m.Build = b
		}
		ms[i] = m
	}
	// Every seventh module is built for arm64 as well, and so is every
	// module it is built on, down to the roots: none is built FROM an
	// image of another platform (a warning). Bases come first.
	arm64 := make([]bool, n)
	for i := n - 1; i >= 0; i-- {
		b := ms[i].Build
		if b == nil || !arm64[i] && i%7 != 0 {
			continue
		}
		b.Platforms = []string{"linux/amd64", "linux/arm64/v8"}
		for _, on := range b.On {
			arm64[benchIndex(on)] = true
		}
	}
	return ms
}

// writeCatalogue writes manifests as <module>.yaml files in dir.
func writeCatalogue(tb testing.TB, dir string, ms []*Manifest) {
	tb.Helper()
	for _, m := range ms {
		data, err := yaml.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, m.Module+".yaml"), data, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

func TestBenchCatalogueIsClean(t *testing.T) {
	ms := benchCatalogue(benchModules)
	for _, p := range Check(ms) {
		t.Errorf("problem: %s", p)
	}
	// Every module refers only to modules before it, so a prefix is a
	// catalogue too; write one to disk and load it back.
	const onDisk = 1500
	dir := t.TempDir()
	writeCatalogue(t, dir, ms[:onDisk])
	c, ps, err := loadOwn(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		t.Errorf("problem: %s", p)
	}
	if len(c.Modules) != onDisk {
		t.Errorf("%d modules, want %d", len(c.Modules), onDisk)
	}
	// A cycle closed across the deepest chain is found and printed whole
	// (m-00000, built for arm64, on m-00999, not: warned of as well).
	ms[0].Build.On = []string{benchName(999)}
	ps = slices.DeleteFunc(Check(ms), func(p Problem) bool { return p.Warning })
	if len(ps) != 1 || !strings.HasPrefix(ps[0].Message, "build.on forms a cycle: m-00000 → m-00999 → m-00998 → ") ||
		strings.Count(ps[0].Message, "→") != 1000 {
		t.Errorf("closing the chain: %d problems, want the one cycle of 1000: %.200v", len(ps), ps)
	}
}

func benchName(i int) string { return fmt.Sprintf("m-%05d", i) }

// benchIndex is the i of benchName(i).
func benchIndex(name string) int {
	i, _ := strconv.Atoi(strings.TrimPrefix(name, "m-"))
	return i
}

// BenchmarkLoadCheck10k times Load — reading, decoding and every check —
// of a 10,000-module catalogue written to disk once.
func BenchmarkLoadCheck10k(b *testing.B) {
	dir := b.TempDir()
	writeCatalogue(b, dir, benchCatalogue(benchModules))
	b.ReportAllocs()
	var ps []Problem
	for b.Loop() {
		var err error
		if _, ps, err = Load(dir); err != nil {
			b.Fatal(err)
		}
	}
	if HasErrors(ps) {
		b.Fatalf("the benchmark catalogue has problems: %v", ps[0])
	}
}

// BenchmarkCheck10k times every check of a 10,000-module catalogue in memory.
func BenchmarkCheck10k(b *testing.B) {
	ms := benchCatalogue(benchModules)
	b.ReportAllocs()
	var ps []Problem
	for b.Loop() {
		ps = Check(ms)
	}
	if HasErrors(ps) {
		b.Fatalf("the benchmark catalogue has problems: %v", ps[0])
	}
}

// BenchmarkLoadCheckDerive10k times the whole of what a raise computes
// before it talks to a server: Load (read, decode, every check) plus every
// derivation — streams, consumers, buckets and each module's permission
// set. It reports the peak heap in use as heap-MiB.
func BenchmarkLoadCheckDerive10k(b *testing.B) {
	dir := b.TempDir()
	writeCatalogue(b, dir, benchCatalogue(benchModules))
	b.ReportAllocs()
	var peak uint64
	for b.Loop() {
		c, ps, err := Load(dir)
		if err != nil || HasErrors(ps) {
			b.Fatalf("load: %v %v", err, ps)
		}
		w := c.Derive(1)
		n := 0
		for _, m := range c.Modules {
			n += len(c.ModulePermissions(m).Publish)
		}
		n += len(c.ControllerPermissions("controller").Publish)
		if len(w.Streams) == 0 || n == 0 {
			b.Fatal("nothing derived")
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
	}
	b.ReportMetric(float64(peak)/(1<<20), "heap-MiB")
}
