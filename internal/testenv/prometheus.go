package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// PrometheusEnv turns on the tests against a real Prometheus that need no
// buildkitd; BuildkitEnv, which make test sets, turns them on too.
const PrometheusEnv = "MESHBUILD_PROMETHEUS"

// RequirePrometheus skips t unless MESHBUILD_PROMETHEUS=1 or
// MESHBUILD_BUILDKIT=1. With either set, a missing Prometheus fails the
// test Prometheus starts.
func RequirePrometheus(t testing.TB) {
	t.Helper()
	if os.Getenv(PrometheusEnv) != "1" && os.Getenv(BuildkitEnv) != "1" {
		t.Skipf("needs Prometheus: set %s=1 (or %s=1, as make test does)", PrometheusEnv, BuildkitEnv)
	}
}

// PrometheusBin is where Debian's prometheus package installs Prometheus.
const PrometheusBin = "/usr/bin/prometheus"

// ScrapeInterval is how often a Prometheus started by Prometheus scrapes
// its targets (and evaluates its rules).
const ScrapeInterval = time.Second

// Prom is a Prometheus server started for a test by Prometheus.
type Prom struct {
	// URL is its HTTP API's base, http://127.0.0.1:PORT.
	URL     string
	t       testing.TB
	targets int
}

// Sample is one series of an instant query's answer.
type Sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"` // [unix time, "value"]
}

func (s Sample) String() string { return fmt.Sprintf("%v=%v", s.Metric, s.Value[1]) }

// Number is the sample's value; ok is false when it is not a finite number
// (NaN, as histogram_quantile answers over no observations, or ±Inf).
func (s Sample) Number() (v float64, ok bool) {
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	return v, err == nil && !math.IsNaN(v) && !math.IsInf(v, 0)
}

// AnyNumber reports whether some sample of res is a finite number.
func AnyNumber(res []Sample) bool {
	for _, s := range res {
		if _, ok := s.Number(); ok {
			return true
		}
	}
	return false
}

// Prometheus starts Prometheus (PrometheusBin, or prometheus in PATH) on a
// free loopback port, its storage in a temp dir, scraping http://T/metrics
// of every target T (host:port) every ScrapeInterval, in one job,
// "meshbuild", so that each target's series carry instance="T". It returns
// once Prometheus is ready; whether the targets are up is WaitUp's to say.
// Prometheus takes up to some 5s more to scrape at all (it applies a
// configuration's targets on a 5s tick): start it early, before the work
// it is to watch.
// It is killed in cleanup, and its output logged if the test failed.
//
// A missing Prometheus fails t, saying to run scripts/install-deps.sh:
// callers gate the test first, with RequirePrometheus or RequireBuildkit.
func Prometheus(t testing.TB, targets []string) *Prom {
	t.Helper()
	bin := prometheusBinary(t)
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
scrape_configs:
  - job_name: meshbuild
    static_configs:
      - targets: [%[2]s]
`, ScrapeInterval, strings.Join(quoted, ", "))
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := FreeAddr(t)
	out := &Buffer{}
	cmd := exec.Command(bin,
		"--config.file="+config,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v: run scripts/install-deps.sh", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus output:\n%s", out.String())
		}
	})
	p := &Prom{URL: "http://" + addr, t: t, targets: len(targets)}
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			t.Fatalf("prometheus exited: %v\n%s", err, out.String())
		default:
		}
		resp, err := http.Get(p.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready in 20s\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// prometheusBinary finds Prometheus in PATH or at PrometheusBin, or fails t.
func prometheusBinary(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	if _, err := os.Stat(PrometheusBin); err == nil {
		return PrometheusBin
	}
	t.Fatalf("prometheus not found in PATH or at %s: run scripts/install-deps.sh", PrometheusBin)
	return ""
}

// WaitUp waits up to d for every target to have been scraped successfully
// (up == 1), and fails the test if they are not.
func (p *Prom) WaitUp(ctx context.Context, d time.Duration) {
	p.t.Helper()
	var last []Sample
	var err error
	p.wait(ctx, d, "every target to be up", func() bool {
		last, err = p.Query(ctx, "up == 1")
		return err == nil && len(last) == p.targets
	}, func() string { return fmt.Sprintf("up == 1: %v (%v); want %d targets", last, err, p.targets) })
}

// WaitScrapes waits up to d for every target to be scraped n more times
// from now, so that a rate over the last n scrapes sees what the targets
// serve now; it fails the test if they are not.
func (p *Prom) WaitScrapes(ctx context.Context, n int, d time.Duration) {
	p.t.Helper()
	from := time.Now()
	var last float64
	var err error
	p.wait(ctx, d, fmt.Sprintf("%d more scrapes of every target", n), func() bool {
		ms := time.Since(from).Milliseconds()
		if ms < 1 {
			return false
		}
		last, err = p.Scalar(ctx, fmt.Sprintf("min(count_over_time(up[%dms])) or vector(0)", ms))
		return err == nil && last >= float64(n)
	}, func() string { return fmt.Sprintf("the least scraped target: %v scrapes (%v)", last, err) })
}

func (p *Prom) wait(ctx context.Context, d time.Duration, what string, cond func() bool, state func() string) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.t.Fatalf("timed out after %s waiting for %s: %s", d, what, state())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Query runs an instant query, which must answer a vector.
func (p *Prom) Query(ctx context.Context, expr string) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/api/v1/query",
		strings.NewReader(url.Values{"query": {expr}}.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("querying %s: %w", expr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("querying %s: %w", expr, err)
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string   `json:"resultType"`
			Result     []Sample `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("querying %s: %s: %w: %s", expr, resp.Status, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("querying %s: %s: %s", expr, resp.Status, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("querying %s: result type %s, want vector", expr, r.Data.ResultType)
	}
	return r.Data.Result, nil
}

// WantNumber runs an instant query and fails t unless it answers a series
// with a number, what naming the query; the answer is logged.
func (p *Prom) WantNumber(t testing.TB, ctx context.Context, what, expr string) {
	t.Helper()
	res, err := p.Query(ctx, expr)
	switch {
	case err != nil:
		t.Errorf("%s: %v", what, err)
	case len(res) == 0:
		t.Errorf("%s: %s: no series", what, expr)
	case !AnyNumber(res):
		t.Errorf("%s: %s: only NaN: %v", what, expr, res)
	default:
		t.Logf("%s: %v", what, res)
	}
}

// Scalar runs an instant query that must answer one series, and returns
// its value.
func (p *Prom) Scalar(ctx context.Context, expr string) (float64, error) {
	res, err := p.Query(ctx, expr)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("querying %s: %d series, want 1", expr, len(res))
	}
	v, _ := res[0].Number()
	return v, nil
}
