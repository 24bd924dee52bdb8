// Package metricstest serves a Prometheus registry for a test, as the
// daemons do (metrics.Serve).
package metricstest

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbuild/meshbuild/metrics"
)

// Serve serves reg's /metrics on a free loopback port for the test's life
// and returns the address it listens on ("127.0.0.1:PORT").
func Serve(tb testing.TB, reg *prometheus.Registry) string {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	addr, err := metrics.Serve(ctx, "127.0.0.1:0", reg)
	if err != nil {
		tb.Fatal(err)
	}
	return addr.String()
}
