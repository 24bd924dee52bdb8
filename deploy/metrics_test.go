package deploy_test

import (
	"bufio"
	"context"
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
	"github.com/meshbuild/meshbuild/metrics"
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
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	addr, err := metrics.Serve(ctx, "127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + addr.String() + "/metrics"
}

// TestNodeMetricsFollowEveryOutcome runs a node against an enforcing NATS
// server, the real registry and an apply hook, and reads its /metrics over
// HTTP after each step, as an operator's Prometheus would: the revision
// lag is 0 after each revision applied, 1 while the hook fails the next
// (a failed outcome counted each time), still 1 when a stale declaration
// is refused meanwhile (a refused outcome counted), and 0 again once a
// newer one applies. The controller's view of the node (declared and
// applied revision, when last heard) follows on its own /metrics.
func TestNodeMetricsFollowEveryOutcome(t *testing.T) {
	reg := testenv.Registry(t)
	b := newBed(t, []string{"n1"})
	b.controller(deploy.DefaultControllerConfig())
	ctrl := serve(t, b.creg)

	// The hook fails while the file fail exists.
	dir := t.TempDir()
	fail := filepath.Join(dir, "fail")
	hook := filepath.Join(dir, "hook.sh")
	script := "#!/bin/sh\nif [ -e " + fail + " ]; then echo \"refusing $MESHBUILD_MODULE\" >&2; exit 3; fi\n"
	if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	nreg := prometheus.NewRegistry()
	n, _ := b.nodeWith("n1", t.TempDir(), nreg, func(cfg *deploy.NodeConfig) { cfg.ApplyHook = hook })
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
		testenv.WaitFor(t, 30*time.Second, what, func() bool {
			nm, cm, diff = scrape(t, node), scrape(t, ctrl), nil
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

	// Revision 1 and 2 apply: lag 0 after each.
	b.setCurrent("base", reg+"/base", pushImage(t, reg, "base"))
	assign(t, b, mesh.AssignTool, "base", "n1")
	first, _ := b.lastDeclaration("n1")
	wait("revision 1 applied", map[string]float64{lag: 0, applied: 1, appliedN: 1, cDecl: 1, cApplied: 1})
	if n.Applied() != 1 {
		t.Fatalf("applied %d, want 1", n.Applied())
	}
	b.setCurrent("app", reg+"/app", pushImage(t, reg, "app"))
	assign(t, b, mesh.AssignTool, "app", "n1")
	m = wait("revision 2 applied", map[string]float64{lag: 0, applied: 2, appliedN: 2, cDecl: 2, cApplied: 2})
	if n.Applied() != 2 {
		t.Fatalf("applied %d, want 2", n.Applied())
	}
	failedBefore, refusedBefore := m[failed], m[refused]

	// Revision 3 (a new app image) fails in the hook: lag 1, failures
	// counted, the controller sees 3 declared and 2 applied.
	if err := os.WriteFile(fail, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	b.setCurrent("app", reg+"/app", pushImage(t, reg, "app"))
	var nm map[string]float64
	testenv.WaitFor(t, 30*time.Second, "revision 3 to fail in the hook", func() bool {
		nm = scrape(t, node)
		return nm[failed] >= failedBefore+1
	})
	if nm[lag] != 1 || n.Applied() != 2 {
		t.Fatalf("after a failed apply of revision 3: lag %v, applied %d; want lag 1, applied 2", nm[lag], n.Applied())
	}
	wait("the controller to see revision 3 failed", map[string]float64{lag: 1, cDecl: 3, cApplied: 2})
	if v := b.nodes()["n1"]; v.Outcome != deploy.Failed || !strings.Contains(v.Reason, "refusing app") {
		t.Fatalf("builds nodes shows %+v, want the hook's failure", v)
	}

	// Revision 1 replayed meanwhile is refused: counted, and the node is
	// still one behind.
	data, _ := json.Marshal(first)
	if _, err := b.ajs.Publish(b.ctx, mesh.NodeSubject("n1"), data); err != nil {
		t.Fatal(err)
	}
	nm = wait("the replayed revision 1 to be refused", map[string]float64{refused: refusedBefore + 1})
	if nm[lag] != 1 || n.Applied() != 2 {
		t.Fatalf("after refusing a stale declaration: lag %v, applied %d; want lag 1, applied 2", nm[lag], n.Applied())
	}

	// The hook works again and revision 4 (another app image) applies:
	// lag 0.
	if err := os.Remove(fail); err != nil {
		t.Fatal(err)
	}
	b.setCurrent("app", reg+"/app", pushImage(t, reg, "app"))
	wait("revision 4 applied", map[string]float64{lag: 0, applied: 3, appliedN: 3, cDecl: 4, cApplied: 4})
	if n.Applied() != 4 {
		t.Fatalf("applied %d, want 4", n.Applied())
	}

	// The controller heard from n1 (heartbeats every 200ms) lately.
	heard := scrape(t, ctrl)[cHeard]
	if age := time.Since(time.Unix(0, int64(heard*1e9))); age < -time.Minute || age > time.Minute {
		t.Fatalf("n1 last heard %v ago by the controller's metrics (%v)", age, heard)
	}
	b.noViolations()
}
