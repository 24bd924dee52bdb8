package testenv

import (
	"context"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// PlanStore starts a JetStream server with the controller's plans bucket
// (build-controller's) and no controller, and opens the store on it: for
// writing plan records as a controller would and reading them back as the
// tools do.
func PlanStore(t testing.TB) (*server.Server, *cascade.Store) {
	t.Helper()
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: mesh.KVBucket("build-controller", cascade.StateBucket)}); err != nil {
		t.Fatal(err)
	}
	st, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}
