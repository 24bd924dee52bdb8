package deploy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/metrics/metricstest"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// scrape reads a /metrics page as Prometheus does, over HTTP, into the
// value of each series by its name and labels as the page writes them
// (`name{a="x",b="y"}`).
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scraping %s: line %q: %v", url, line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// serve serves reg's /metrics on a free loopback port for the test's life,
// as mesh-node and build-controller do (metrics.Serve), and returns its URL.
func serve(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	return "http://" + metricstest.Serve(t, reg) + "/metrics"
}

// TestNodeMetricsFollowEveryOutcome runs a node against an enforcing NATS
// server, the real registry and an apply hook, and reads its /metrics over
// HTTP after each step, as an operator's Prometheus would: the revision
// lag is 0 after each of two revisions applied, 1 as soon as the node sees the
// next (while the hook still runs) and while the hook fails it (a failed
// outcome counted each time), still 1 when a stale declaration
// is refused meanwhile (a refused outcome counted), and 0 again once a
// newer one applies. The controller's view of the node (declared and
// applied revision, when last heard) follows on its own /metrics.
func TestNodeMetricsFollowEveryOutcome(t *testing.T) {
	reg := registrytest.Registry(t)
	b := newBed(t, []string{"n1"})
	b.controller(deploy.DefaultControllerConfig())
	ctrl := serve(t, b.creg)

	// The hook waits while the file hold exists, then fails while the
	// file fail exists.
	dir := t.TempDir()
	hold, fail := filepath.Join(dir, "hold"), filepath.Join(dir, "fail")
	hook := filepath.Join(dir, "hook.sh")
	script := "#!/bin/sh\nwhile [ -e " + hold + " ]; do sleep 0.05; done\n" +
		"if [ -e " + fail + " ]; then echo \"refusing $MESHBUILD_MODULE\" >&2; exit 3; fi\n"
	if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	nreg := prometheus.NewRegistry()
	// Heartbeats are rare here: what the controller knows of the node's
	// revisions comes from its reports.
	n, _ := b.nodeWith("n1", t.TempDir(), nreg, func(cfg *deploy.NodeConfig) { cfg.ApplyHook, cfg.Heartbeat = hook, time.Hour })
	node := serve(t, nreg)
	run(b.ctx, n.Run)
	testenv.WaitFor(t, 10*time.Second, "n1 to enrol", func() bool { _, ok := b.nodes()["n1"]; return ok })

	const (
		lag      = `meshbuild_node_revision_lag{node="n1"}`
		applied  = `meshbuild_node_applies_total{node="n1",outcome="applied"}`
		failed   = `meshbuild_node_applies_total{node="n1",outcome="failed"}`
		refused  = `meshbuild_node_applies_total{node="n1",outcome="refused"}`
		appliedN = `meshbuild_node_apply_seconds_count{node="n1",outcome="applied"}`
		cDecl    = `meshbuild_controller_node_declared_revision{node="n1"}`
		cApplied = `meshbuild_controller_node_applied_revision{node="n1"}`
		cHeard   = `meshbuild_controller_node_heard_timestamp_seconds{node="n1"}`
	)
	m := scrape(t, node)
	for _, series := range []string{lag, applied, failed, refused} {
		if v, ok := m[series]; !ok || v != 0 {
			t.Fatalf("before any declaration, %s is %v (there: %v), want 0", series, v, ok)
		}
	}
	// wait waits until the node's and the controller's pages say what want
	// says (series → value), and returns the node's page.
	wait := func(what string, want map[string]float64) map[string]float64 {
		t.Helper()
		var nm, cm map[string]float64
		var diff []string
		defer func() { // WaitFor's Fatalf ends the test here: say what differed
			if t.Failed() {
				t.Logf("waiting for %s, last seen: %s", what, strings.Join(diff, "; "))
			}
		}()
		testenv.WaitFor(t, 30*time.Second, what, func() bool {
			// The controller's page first: a report it recorded was
			// counted by the node before it was sent.
			cm = scrape(t, ctrl)
			nm, diff = scrape(t, node), nil
			for series, v := range want {
				page := nm
				if strings.HasPrefix(series, "meshbuild_controller_") {
					page = cm
				}
				if got, ok := page[series]; !ok || got != v {
					diff = append(diff, fmt.Sprintf("%s=%v (there: %v), want %v", series, got, ok, v))
				}
			}
			return len(diff) == 0
		})
		return nm
	}

	declared := func(module, digest string) deploy.Declaration { return b.declaredWith("n1", module, digest) }
	rev := func(r uint64) float64 { return float64(r) }
	appliedOnce := func(m map[string]float64) {
		t.Helper()
		if m[appliedN] != m[applied] {
			t.Fatalf("%v applies counted, %v timed", m[applied], m[appliedN])
		}
	}

	// Two revisions apply (base, then app): lag 0 after each.
	digest := pushImage(t, reg, "base")
	b.setCurrent("base", reg+"/base", digest)
	assign(t, b, mesh.AssignTool, "base", "n1")
	first := declared("base", digest)
	m = wait("the base's revision applied", map[string]float64{lag: 0, cDecl: rev(first.Revision), cApplied: rev(first.Revision)})
	if n.Applied() != first.Revision || m[applied] < 1 {
		t.Fatalf("applied revision %d (%v applies counted), want %d", n.Applied(), m[applied], first.Revision)
	}
	appliedOnce(m)
	appliedBefore := m[applied]
	digest = pushImage(t, reg, "app")
	b.setCurrent("app", reg+"/app", digest)
	assign(t, b, mesh.AssignTool, "app", "n1")
	second := declared("app", digest).Revision
	m = wait("the app's revision applied", map[string]float64{lag: 0, cDecl: rev(second), cApplied: rev(second)})
	if n.Applied() != second || m[applied] < appliedBefore+1 {
		t.Fatalf("applied revision %d (%v applies counted), want %d and more than %v", n.Applied(), m[applied], second, appliedBefore)
	}
	appliedOnce(m)
	failedBefore, refusedBefore, appliedBefore := m[failed], m[refused], m[applied]

	// The next revision (a new app image): while the hook holds it, the
	// node is one behind already; then the hook fails it: lag 1, failures
	// counted, the controller sees it declared and the one before applied.
	for _, f := range []string{hold, fail} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	digest = pushImage(t, reg, "app")
	b.setCurrent("app", reg+"/app", digest)
	third := declared("app", digest).Revision
	if third != second+1 {
		t.Fatalf("a new image declared revision %d after %d", third, second)
	}
	wait("the new revision seen and held in the hook", map[string]float64{lag: 1, failed: failedBefore, applied: appliedBefore, cDecl: rev(third)})
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	var nm map[string]float64
	testenv.WaitFor(t, 30*time.Second, "the new revision to fail in the hook", func() bool {
		nm = scrape(t, node)
		return nm[failed] >= failedBefore+1
	})
	if nm[lag] != 1 || n.Applied() != second {
		t.Fatalf("after a failed apply of revision %d: lag %v, applied %d; want lag 1, applied %d", third, nm[lag], n.Applied(), second)
	}
	wait("the controller to see the failure", map[string]float64{lag: 1, cDecl: rev(third), cApplied: rev(second)})
	if v := b.nodes()["n1"]; v.Outcome != deploy.Failed || !strings.Contains(v.Reason, "refusing app") {
		t.Fatalf("builds nodes shows %+v, want the hook's failure", v)
	}

	// The first revision replayed meanwhile is refused: counted, and the
	// node is still one behind.
	data, _ := json.Marshal(first)
	if _, err := b.ajs.Publish(b.ctx, mesh.NodeSubject("n1"), data); err != nil {
		t.Fatal(err)
	}
	nm = wait("the replayed revision to be refused", map[string]float64{refused: refusedBefore + 1})
	if nm[lag] != 1 || n.Applied() != second {
		t.Fatalf("after refusing a stale declaration: lag %v, applied %d; want lag 1, applied %d", nm[lag], n.Applied(), second)
	}

	// The hook works again and the next revision (another app image)
	// applies: lag 0.
	if err := os.Remove(fail); err != nil {
		t.Fatal(err)
	}
	digest = pushImage(t, reg, "app")
	b.setCurrent("app", reg+"/app", digest)
	fourth := declared("app", digest).Revision
	m = wait("the last revision applied", map[string]float64{lag: 0, applied: appliedBefore + 1, cDecl: rev(fourth), cApplied: rev(fourth)})
	if n.Applied() != fourth {
		t.Fatalf("applied %d, want %d", n.Applied(), fourth)
	}
	appliedOnce(m)

	// The controller heard from n1 lately (its last report).
	heard := scrape(t, ctrl)[cHeard]
	if age := time.Since(time.Unix(0, int64(heard*1e9))); age < -time.Minute || age > time.Minute {
		t.Fatalf("n1 last heard %v ago by the controller's metrics (%v)", age, heard)
	}
	b.noViolations()
}
