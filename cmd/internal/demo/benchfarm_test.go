package demo

import (
	"context"
	"testing"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/cmd/internal/farm/farmtest"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// upBenchFarm starts the embedded farm of the benchmarks on catalogue:
// agents machines, each with a buildkitd of its own (maxParallelism 0:
// buildkitd's own), in a fresh state directory, which it returns. stop
// stops the farm, failing b if that fails, and logs the farm's log if b
// has failed.
func upBenchFarm(b *testing.B, catalogue string, agents, maxParallelism int) (f *farm.Farm, state string, stop func()) {
	b.Helper()
	state = b.TempDir()
	f, _, stopFarm := farmtest.Up(b, farm.UpOptions{
		Catalogue: catalogue, Agents: agents, StateDir: state,
		BuildkitdPerAgent: true, MaxParallelism: maxParallelism,
		InsteadOf: InsteadOf(state),
	})
	return f, state, func() {
		if err := f.Stop(); err != nil {
			b.Errorf("Stop: %v", err)
		}
		stopFarm()
	}
}

// operatorStore connects to f's NATS as the operator, named name, and
// opens the controller's store. The caller closes the connection.
func operatorStore(tb testing.TB, ctx context.Context, f *farm.Farm, name string) (*nats.Conn, jetstream.JetStream, *cascade.Store) {
	tb.Helper()
	nc, js, err := daemon.Connect(f.NATSURL(), f.OperatorCreds(), mesh.OperatorPrincipal, name)
	if err != nil {
		tb.Fatal(err)
	}
	store, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		nc.Close()
		tb.Fatal(err)
	}
	return nc, js, store
}

// onlyPlan is the one plan in store, what that plan is (for the failure);
// fails tb if there is not exactly one.
func onlyPlan(tb testing.TB, ctx context.Context, store *cascade.Store, what string) cascade.PlanRecord {
	tb.Helper()
	plans, err := store.Plans(ctx)
	if err != nil || len(plans) != 1 {
		tb.Fatalf("Plans = %v, %v; want %s", plans, err, what)
	}
	return plans[0]
}
