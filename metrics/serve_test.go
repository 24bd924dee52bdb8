package metrics_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbuild/meshbuild/metrics"
)

func TestServeServesMetricsUntilTheContextEnds(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics.NewAgent(reg, "m1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := metrics.Serve(ctx, "127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + addr.String() + "/metrics"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `meshbuild_agent_asks_in_flight{machine="m1"} 0`) {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}

	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(url)
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("still serving 5s after the context ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestServeWithNoAddressServesNothing(t *testing.T) {
	addr, err := metrics.Serve(context.Background(), "", prometheus.NewRegistry())
	if addr != nil || err != nil {
		t.Fatalf("Serve with no address: %v, %v; want nil, nil", addr, err)
	}
}

func TestServeRefusesAnAddressInUse(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := metrics.Serve(ctx, "127.0.0.1:0", prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.Serve(ctx, addr.String(), prometheus.NewRegistry()); err == nil {
		t.Fatalf("serving twice on %s: no error", addr)
	}
}
