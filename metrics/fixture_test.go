package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

const repo = "https://git.example/fleet.git"

// farm is a catalogue from a build.on graph, the mesh's own modules around
// it: the build agent's seat, the controller and the git seat's holder.
func farm(graph map[string][]string) *mesh.Catalogue {
	ms := []*mesh.Manifest{
		{Module: "build-agent", Seats: []mesh.Seat{{Seat: mesh.BuildSeat, Scope: "node", Accepts: []string{"build retain 7d"},
			Emits: []string{"started", "built", "failed", "log.*"}, Serves: []string{"status", "cancel"}}}},
		{Module: "build-controller", Holds: []string{"mesh-controller"}, Uses: []string{mesh.BuildSeat},
			Consumes: []string{"mesh-git.pushed", "node-build-agent.started", "node-build-agent.built", "node-build-agent.failed"},
			Serves:   []string{"rebuild", "retry", "cancel"},
			State:    []mesh.Bucket{{Name: "plans", History: 1}, {Name: "declarations", History: 1}}},
		{Module: "git", Holds: []string{"mesh-git"}},
	}
	for m, on := range graph {
		ms = append(ms, &mesh.Manifest{Module: m, Build: &mesh.Build{Repo: repo, Path: m, On: on}})
	}
	return mesh.NewCatalogue(ms)
}

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
	if _, err := mesh.Raise(testCtx(t), js, farm(map[string][]string{"a": nil}), 1); err != nil {
		t.Fatal(err)
	}
	return js
}
