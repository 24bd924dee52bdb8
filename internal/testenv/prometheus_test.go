package testenv_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/internal/testenv"
)

// Prometheus scrapes every target, labels each series with its target, and
// answers queries; a bad query is an error, not a failed test.
func TestPrometheus(t *testing.T) {
	testenv.RequirePrometheus(t)
	var targets []string
	for i := range 2 {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprintf(w, "# TYPE demo_total counter\ndemo_total{n=\"%d\"} %d\n", i, 10+i)
		}))
		t.Cleanup(s.Close)
		targets = append(targets, strings.TrimPrefix(s.URL, "http://"))
	}
	ctx := context.Background()
	p := testenv.Prometheus(t, targets)
	p.WaitUp(ctx, 20*time.Second)
	p.WaitScrapes(ctx, 2, 10*time.Second)

	res, err := p.Query(ctx, "demo_total")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range res {
		v, ok := s.Number()
		if !ok {
			t.Errorf("%v: not a number", s)
		}
		got[s.Metric["instance"]] = fmt.Sprintf("%s=%g", s.Metric["n"], v)
	}
	if len(got) != 2 || got[targets[0]] != "0=10" || got[targets[1]] != "1=11" {
		t.Errorf("demo_total by instance: %v, want %s: 0=10, %s: 1=11", got, targets[0], targets[1])
	}
	if !testenv.AnyNumber(res) {
		t.Errorf("AnyNumber(%v) = false", res)
	}
	if v, err := p.Scalar(ctx, "sum(demo_total)"); err != nil || v != 21 {
		t.Errorf("sum(demo_total) = %v, %v; want 21", v, err)
	}
	if _, err := p.Scalar(ctx, "demo_total"); err == nil {
		t.Errorf("Scalar of two series: no error")
	}
	if _, err := p.Query(ctx, "sum(("); err == nil {
		t.Errorf("a query that does not parse: no error")
	}
	if res, err := p.Query(ctx, `histogram_quantile(0.5, demo_total)`); err != nil || testenv.AnyNumber(res) {
		t.Errorf("a quantile of no buckets: %v, %v; want only NaN", res, err)
	}
}
