package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// TestDocumentIsTheSavedRun: BENCHMARKS.md is the template rendered from
// the run saved in BENCHMARKS.json, word for word, so that no figure in its
// table or its prose can drift from the run (after editing the template:
// go run ./cmd/benchtable -render BENCHMARKS.json -o BENCHMARKS.md).
func TestDocumentIsTheSavedRun(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := LoadReport(filepath.Join(root, "BENCHMARKS.json"))
	if err != nil {
		t.Fatal(err)
	}
	for bench, why := range rep.Failed {
		t.Errorf("the saved run has %s failed: %s", bench, why)
	}
	doc, err := Render(rep)
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile(filepath.Join(root, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(have) != doc {
		t.Errorf("BENCHMARKS.md is not the template rendered from BENCHMARKS.json: run\n\tgo run ./cmd/benchtable -render BENCHMARKS.json -o BENCHMARKS.md\n(or make bench) and commit both")
	}
	for _, r := range rows {
		if _, ok := rep.Results[r.bench][r.metric]; !ok {
			t.Errorf("the saved run has no %s of %s", r.metric, r.bench)
		}
	}
}

// TestTemplateQuotesNoFigures: the template's text, outside its actions,
// holds no decimal figure: a measured figure in prose is a reference to the
// run ({{fig …}}), never typed in.
func TestTemplateQuotesNoFigures(t *testing.T) {
	text := regexp.MustCompile(`(?s)\{\{.*?\}\}`).ReplaceAllString(docTemplate, "")
	if m := regexp.MustCompile(`\d+\.\d+|\d+,\d{3}\s*(modules/s|modules a second)`).FindAllString(text, -1); len(m) > 0 {
		t.Errorf("the template types figures in: %q", m)
	}
}

// TestRenderRefusesAMissingFigure: a figure the run does not have is an
// error naming it, not a blank in the prose.
func TestRenderRefusesAMissingFigure(t *testing.T) {
	rep := &Report{Results: results{}, Suites: map[string]string{}}
	_, err := Render(rep)
	if err == nil || !strings.Contains(err.Error(), "Benchmark") {
		t.Fatalf("Render of an empty run: %v", err)
	}
}

func TestParse(t *testing.T) {
	res := results{}
	name := "BenchmarkX/sub"
	if p := runtime.GOMAXPROCS(0); p > 1 {
		name += fmt.Sprintf("-%d", p) // as go test names it
	}
	parse([]byte("goos: linux\n"+name+"   \t1\t123 ns/op\t  1.5 makespan/lb\t 7 first-start-ms\nPASS\n"), res)
	if m := res["BenchmarkX/sub"]; m["makespan/lb"] != 1.5 || m["first-start-ms"] != 7 {
		t.Errorf("parsed %v", res)
	}
}

// TestTemplateRenders: with every figure the template and the rows name
// present, the document renders, and each figure lands in it.
func TestTemplateRenders(t *testing.T) {
	rep := &Report{Results: results{}, Suites: map[string]string{}, Machine: "Measured on a test"}
	set := func(bench, metric string, v float64) {
		if rep.Results[bench] == nil {
			rep.Results[bench] = metrics{}
		}
		rep.Results[bench][metric] = v
	}
	refs := regexp.MustCompile(`(?:fig|val) "([^"]+)" "([^"]+)"`).FindAllStringSubmatch(docTemplate, -1)
	if len(refs) < 20 {
		t.Fatalf("the template references %d figures", len(refs))
	}
	for _, r := range rows {
		set(r.bench, r.metric, 1)
	}
	for i, m := range refs {
		set(m[1], m[2], 1000+float64(i))
	}
	for _, s := range suites {
		rep.Suites[s.bench] = "1m0s"
	}
	doc, err := Render(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range refs {
		v := rep.Results[m[1]][m[2]] // the last value set for it
		if !strings.Contains(doc, fmt.Sprint(v)) {
			t.Errorf("%s %s (%v) is not in the document", m[1], m[2], v)
		}
	}
	if strings.Contains(doc, "<no value>") || !strings.Contains(doc, "| figure | measured |") {
		t.Errorf("the document:\n%s", doc)
	}
}

// The machine counts as quiet only once it has been under the busy share
// for the whole quiet span, never from one sample.
func TestQuietNeedsTheWholeSpan(t *testing.T) {
	n := int(settleQuiet / settleTick)
	idle := func(k int) []cpuTimes { // k ticks of 100 jiffies, all idle
		out := make([]cpuTimes, k)
		for i := range out {
			out[i] = cpuTimes{total: uint64(100 * i), idle: uint64(100 * i)}
		}
		return out
	}
	if ok, _ := quiet(idle(n)); ok {
		t.Errorf("quiet after %d samples, want %d spanning %s", n, n+1, settleQuiet)
	}
	if ok, b := quiet(idle(n + 1)); !ok || b != 0 {
		t.Errorf("an idle machine: quiet %v, busy %.2f", ok, b)
	}
	s := idle(n + 1)
	s[len(s)-1].idle -= 50 // half of the last tick busy
	if ok, b := quiet(s); ok || b < settleBusy {
		t.Errorf("a machine busy %.2f of the span: quiet %v", b, ok)
	}
	if _, ok := readCPUTimes(); !ok {
		t.Skip("no /proc/stat here")
	}
}

// TestRenderShowsAFailedBenchmark: a benchmark that failed in the run (its
// rows ERROR in the table) reads "—" where the prose quotes it, and the
// others' figures are still rendered; the document is not lost.
func TestRenderShowsAFailedBenchmark(t *testing.T) {
	rep := &Report{Results: results{}, Suites: map[string]string{}, Failed: map[string]string{}, Machine: "Measured on a test"}
	for _, s := range suites {
		rep.Suites[s.bench] = "1m0s"
	}
	refs := regexp.MustCompile(`(?:fig|val) "([^"]+)" "([^"]+)"`).FindAllStringSubmatch(docTemplate, -1)
	var gone string
	for _, m := range refs {
		if strings.HasPrefix(m[1], "BenchmarkFleet1000/") {
			gone = "BenchmarkFleet1000"
			continue
		}
		if rep.Results[m[1]] == nil {
			rep.Results[m[1]] = metrics{}
		}
		rep.Results[m[1]][m[2]] = 4242.5
	}
	if gone == "" {
		t.Fatal("the template quotes no figure of BenchmarkFleet1000")
	}
	for _, r := range rows {
		if !strings.HasPrefix(r.bench, gone+"/") {
			if rep.Results[r.bench] == nil {
				rep.Results[r.bench] = metrics{}
			}
			rep.Results[r.bench][r.metric] = 1
		}
	}
	rep.Failed[gone] = "go test exited 1"
	doc, err := Render(rep)
	if err != nil {
		t.Fatalf("Render with %s failed: %v", gone, err)
	}
	if !strings.Contains(doc, "ERROR: go test exited 1") || !strings.Contains(doc, "—") || !strings.Contains(doc, "4242") {
		t.Errorf("the document does not show the failed benchmark beside the others' figures:\n%s", doc)
	}
}

// TestProbeHostMeasures: the host probe times real work (both halves
// positive, the round trips made over a real connection), and the
// document says a run's host speeds, or that an older run has none.
func TestProbeHostMeasures(t *testing.T) {
	h := probeHost()
	if h == nil || h.SHA256MBps <= 0 || h.RoundTrips <= 0 {
		t.Fatalf("probeHost() = %+v, want both halves measured", h)
	}
	line := hostLine([2]*HostSpeed{h, {SHA256MBps: 1234, RoundTrips: 56789}})
	for _, want := range []string{fmt.Sprintf("%.0f and 1234 MB/s", h.SHA256MBps), fmt.Sprintf("%.0f and 56789 loopback", h.RoundTrips)} {
		if !strings.Contains(line, want) {
			t.Errorf("hostLine = %q, want it to say %q", line, want)
		}
	}
	if line := hostLine([2]*HostSpeed{h, nil}); !strings.Contains(line, "not probed") {
		t.Errorf("hostLine of a run without its end probe = %q", line)
	}
}

// TestHostVersusTheSavedRun: a run's host is compared with the saved
// run's by the mean of each run's probes; a run without probes is not.
func TestHostVersusTheSavedRun(t *testing.T) {
	saved := [2]*HostSpeed{{SHA256MBps: 400, RoundTrips: 20000}, {SHA256MBps: 600, RoundTrips: 30000}}
	now := [2]*HostSpeed{{SHA256MBps: 250, RoundTrips: 50000}, {SHA256MBps: 250, RoundTrips: 50000}}
	vs := hostVersus(now, saved)
	for _, want := range []string{"sha256 ×0.50", "round trips ×2.00"} {
		if !strings.Contains(vs, want) {
			t.Errorf("hostVersus = %q, want %q", vs, want)
		}
	}
	if vs := hostVersus(now, [2]*HostSpeed{}); vs != "" {
		t.Errorf("against a saved run never probed: %q, want nothing", vs)
	}
}
