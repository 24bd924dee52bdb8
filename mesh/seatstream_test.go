package mesh_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// The build seat's queue holds exactly what its holders' consumers read:
// on a real server, an ask published on the bare verb (…accept.build, the
// subject the README once documented) or for a platform the catalogue
// does not build is refused at once (no stream answers), while one for a
// platform it builds is kept. Raising twice changes nothing; a catalogue
// that builds a new platform, raised, opens its subject.
func TestAnAskNoConsumerReadsIsRefusedAtOnce(t *testing.T) {
	ms := fixture()
	c := mesh.NewCatalogue(ms)
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	if _, err := mesh.Raise(ctx(t), js, c, 1); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx(t), mesh.SeatStream(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	var filters []string
	for _, cs := range mesh.SeatConsumerSpecs(mesh.Seat{Seat: mesh.BuildSeat, Accepts: []string{mesh.BuildVerb}}, c.Platforms(), 1) {
		filters = append(filters, cs.Config.FilterSubject)
	}
	if got := st.CachedInfo().Config.Subjects; !slices.Equal(got, filters) {
		t.Fatalf("the seat's stream takes %v, want exactly its consumers' filters %v", got, filters)
	}

	refused := func(subject string) {
		t.Helper()
		_, err := js.Publish(ctx(t), subject, []byte(`{}`))
		if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("publishing on %s: %v, want refused at once (no stream)", subject, err)
		}
	}
	refused(mesh.SeatAcceptSubject(mesh.BuildSeat, mesh.BuildVerb))
	refused(mesh.BuildSubject("linux/arm64"))
	if _, err := js.Publish(ctx(t), mesh.BuildSubject(mesh.DefaultPlatform), []byte(`{}`)); err != nil {
		t.Fatalf("publishing for %s: %v", mesh.DefaultPlatform, err)
	}

	r, err := mesh.Raise(ctx(t), js, c, 1)
	if err != nil || r.Changed() {
		t.Fatalf("raising again: %+v (%v), want nothing changed", r, err)
	}

	withArm := mesh.NewCatalogue(append(fixture(), &mesh.Manifest{Module: "tool", Build: &mesh.Build{Repo: "r", Platforms: []string{"linux/arm64"}}}))
	r, err = mesh.Raise(ctx(t), js, withArm, 1)
	if err != nil || !slices.Contains(r.Updated, "stream "+mesh.SeatStream(mesh.BuildSeat)) {
		t.Fatalf("raising a catalogue that builds arm64: %+v (%v), want the seat's stream updated", r, err)
	}
	if _, err := js.Publish(ctx(t), mesh.BuildSubject("linux/arm64"), []byte(`{}`)); err != nil {
		t.Fatalf("publishing for linux/arm64 once it is built for: %v", err)
	}
	refused(mesh.SeatAcceptSubject(mesh.BuildSeat, mesh.BuildVerb))
	if r, err := mesh.Raise(ctx(t), js, withArm, 1); err != nil || r.Changed() {
		t.Fatalf("raising it again: %+v (%v), want nothing changed", r, err)
	}
}
