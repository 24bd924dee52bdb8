package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

const repo = meshtest.FleetRepo

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// raisedQueue starts a real NATS server and raises the build seat's work
// queue on it.
func raisedQueue(t *testing.T) jetstream.JetStream {
	t.Helper()
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	if _, err := mesh.Raise(testCtx(t), js, meshtest.Catalogue(t, map[string][]string{"a": nil}), 1); err != nil {
		t.Fatal(err)
	}
	return js
}
