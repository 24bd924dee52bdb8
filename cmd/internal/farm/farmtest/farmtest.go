// Package farmtest starts the embedded farm of `builds up` (farm.Up) for a
// test, on free loopback ports, with its log kept for the test.
package farmtest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// Up starts the farm with o: NATS and the registry on free loopback ports
// where o names no address, the repository's bin/buildkitd where o names
// neither a buildkitd nor its binary, and the farm's log (o.Log) written to
// logs. It fails tb if Up fails. stop stops the farm (Stop is safe to call
// again: its error is the caller's to check) and, if tb has failed, logs
// the farm's log.
func Up(tb testing.TB, o farm.UpOptions) (f *farm.Farm, logs *testenv.Buffer, stop func()) {
	tb.Helper()
	if o.ListenNATS == "" {
		o.ListenNATS = "127.0.0.1:0"
	}
	if o.ListenRegistry == "" {
		o.ListenRegistry = "127.0.0.1:0"
	}
	if o.BuildKit == "" && o.BuildkitdBin == "" {
		o.BuildkitdBin = testenv.BuildkitdBin(tb)
	}
	logs = &testenv.Buffer{}
	o.Log = slog.New(slog.NewTextHandler(logs, nil))
	f, err := farm.Up(context.Background(), o)
	if err != nil {
		tb.Fatalf("Up: %v", err)
	}
	return f, logs, func() {
		f.Stop()
		if tb.Failed() {
			tb.Logf("farm log:\n%s", logs.String())
		}
	}
}
