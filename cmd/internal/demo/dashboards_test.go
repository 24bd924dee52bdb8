package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/cmd/internal/farm/farmtest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/metrics"
)

// The Grafana dashboards against a real Prometheus scraping the farm of
// builds up: Up with two agents serving /metrics, the demo plan with one
// module whose Dockerfile fails, and then every query of every dashboard
// panel must answer a series with a number.
func TestDashboardsOnBuildsUp(t *testing.T) {
	testenv.RequireBuildkit(t)
	began := time.Now()
	since := func() time.Duration { return time.Since(began).Round(time.Millisecond) }
	catalogue, src := testenv.SmallFleet(t, "base", "runtime", "tool-01", "tool-02")
	// tool-02's Dockerfile fails, for the failures panels.
	broken := filepath.Join(src, "tools", "tool-02", "Dockerfile")
	df, err := os.ReadFile(broken)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(broken, append(df, "RUN echo broken by the test >&2 && exit 3\n"...), 0o644); err != nil {
		t.Fatal(err)
	}

	// Prometheus first: it scrapes nothing for its first few seconds, and
	// rate() must see the builds happen. The controller serves on the base
	// port, agent i on the port i above it.
	metricsBase := testenv.FreePorts(t, 3)
	host, p, _ := net.SplitHostPort(metricsBase)
	port, _ := strconv.Atoi(p)
	var targets []string
	for i := range 3 {
		targets = append(targets, host+":"+strconv.Itoa(port+i))
	}
	prom := testenv.Prometheus(t, targets)

	state := t.TempDir()
	f, _, stop := farmtest.Up(t, farm.UpOptions{
		Catalogue: catalogue, Agents: 2, StateDir: state,
		MetricsBase: metricsBase, InsteadOf: InsteadOf(state),
	})
	defer stop()
	var served []string
	for _, u := range f.MetricsURLs() {
		served = append(served, strings.TrimSuffix(strings.TrimPrefix(u, "http://"), "/metrics"))
	}
	if !slices.Equal(served, targets) {
		t.Fatalf("the farm serves /metrics on %v, want %v", served, targets)
	}
	t.Logf("farm up %s after the start", since())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prom.WaitUp(ctx, 20*time.Second)
	t.Logf("Prometheus scrapes the farm %s after the start", since())

	var out bytes.Buffer
	err = Run(ctx, f, src, &out)
	if !errors.Is(err, ErrPlanNotBuilt) || !strings.Contains(err.Error(), "tool-02 (build") {
		t.Fatalf("Run: %v, want ErrPlanNotBuilt for tool-02's build\n%s", err, out.String())
	}
	t.Logf("demo plan settled %s after the start:\n%s", since(), out.String())

	// The settled plan reaches Prometheus; then rate() needs a few scrapes
	// in its window.
	var failed, settled float64
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		failed, _ = prom.Scalar(ctx, `sum(meshbuild_agent_builds_total{outcome="failed",reason="build"})`)
		settled, _ = prom.Scalar(ctx, `sum(meshbuild_controller_plans_settled_total{outcome="failed"})`)
		if failed == 1 && settled == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 15s Prometheus has %v failed builds and %v failed plans, want 1 and 1", failed, settled)
		}
	}
	prom.WaitScrapes(ctx, 3, 10*time.Second)
	if built, err := prom.Scalar(ctx, `sum(meshbuild_agent_builds_total{outcome="built"})`); err != nil || built != 3 {
		t.Errorf("builds_total{outcome=built} summed over machines: %v (%v), want 3", built, err)
	}

	panels, err := metrics.DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "30s", "$__range", "1m")
	for _, p := range panels {
		prom.WantNumber(t, ctx, fmt.Sprintf("%s %q", p.Dashboard, p.Title), vars.Replace(p.Expr))
	}
	t.Logf("%d panel queries checked %s after the start", len(panels), since())
}
