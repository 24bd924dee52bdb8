package seat

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// OpenBucket binds the key-value bucket a controller module declares as
// state under name (its manifest's `state: [{name: …}]`); the catalogue's
// raise creates it.
func OpenBucket(ctx context.Context, js jetstream.JetStream, controllerModule, name string) (jetstream.KeyValue, error) {
	bucket := mesh.KVBucket(controllerModule, name)
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("opening bucket %s (is the catalogue raised? module %s must declare state %q): %w",
			bucket, controllerModule, name, err)
	}
	return kv, nil
}

// ControllerModule is the catalogue module that holds the controller seat
// (mesh.ControllerSeat) and declares state bucket: the one named name, or,
// when name is empty, the first such. It reports false when none does; the
// caller says what its manifest must declare.
func ControllerModule(cat *mesh.Catalogue, name, bucket string) (string, bool) {
	for _, m := range cat.Holders(mesh.ControllerSeat) {
		if name != "" && m.Module != name {
			continue
		}
		for _, b := range m.State {
			if b.Name == bucket {
				return m.Module, true
			}
		}
	}
	return "", false
}
