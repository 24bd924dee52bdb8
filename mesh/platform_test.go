package mesh_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

func TestPlatformTokensAreOneSpelling(t *testing.T) {
	for in, want := range map[string]string{
		"linux/amd64": "linux-amd64", "linux/arm64": "linux-arm64", "linux/arm64/v8": "linux-arm64",
		"linux/arm/v7": "linux-arm-v7", "linux/arm": "linux-arm-v7",
	} {
		if got := mesh.PlatformToken(in); got != want {
			t.Errorf("PlatformToken(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := mesh.NormalizePlatform("amd64"); err == nil {
		t.Error("a platform without an os was accepted")
	}
	if got := mesh.BuildSubject("linux/arm/v7"); got != "mesh.seat.node-build-agent.accept.build.linux-arm-v7" {
		t.Errorf("BuildSubject = %s", got)
	}
	if got := mesh.BuildConsumer("linux/arm64"); got != "holders-node-build-agent-linux-arm64" {
		t.Errorf("BuildConsumer = %s", got)
	}
}

// The build seat has one holders' consumer per platform of the catalogue,
// each filtering its platform's subject, raised with the seat on a real
// server; an ask published for arm64 is delivered by the arm64 consumer
// and never by the amd64 one; the agent's grant covers each.
func TestTheBuildSeatSplitsByPlatform(t *testing.T) {
	ms := fixture()
	ms = append(ms, &mesh.Manifest{Module: "tool", Build: &mesh.Build{Repo: "r", Platforms: []string{"linux/arm64", "linux/amd64"}}})
	c := mesh.NewCatalogue(ms)
	if got := c.Platforms(); !slices.Equal(got, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("platforms %v", got)
	}
	var names []string
	for _, cs := range c.Derive(1).Consumers {
		if cs.Stream != mesh.SeatStream(mesh.BuildSeat) {
			continue
		}
		names = append(names, cs.Config.Durable)
		p := "linux/amd64"
		if cs.Config.Durable == mesh.BuildConsumer("linux/arm64") {
			p = "linux/arm64"
		}
		if cs.Config.FilterSubject != mesh.BuildSubject(p) || cs.Config.MaxWaiting < 1000 {
			t.Errorf("consumer %s filters %q (max waiting %d), want %s", cs.Config.Durable, cs.Config.FilterSubject, cs.Config.MaxWaiting, mesh.BuildSubject(p))
		}
	}
	if !slices.Equal(names, []string{mesh.BuildConsumer("linux/amd64"), mesh.BuildConsumer("linux/arm64")}) {
		t.Fatalf("build seat consumers %v", names)
	}
	perms, err := c.MachinePermissions("m1")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range c.Platforms() {
		if !slices.Contains(perms.Publish, mesh.AckSubject(mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(p))) {
			t.Errorf("the holder's grant lacks the ack grant of %s", p)
		}
	}

	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	// A seat-wide consumer from before the split is replaced, not kept to
	// overlap the platforms' filters.
	seat, _ := mesh.SeatStreamSpec(mesh.Seat{Seat: mesh.BuildSeat, Accepts: []string{"build retain 7d"}}, c.Platforms(), 1)
	seat.Config.Subjects = []string{mesh.SeatAcceptAll(mesh.BuildSeat)} // as it was before the split
	if _, err := js.CreateStream(ctx(t), seat.Config); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx(t), mesh.SeatStream(mesh.BuildSeat), mesh.SeatConsumerSpec(mesh.Seat{Seat: mesh.BuildSeat}, 1).Config); err != nil {
		t.Fatal(err)
	}
	r, err := mesh.Raise(ctx(t), js, c, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.Updated, "consumer SEAT_node-build-agent/holders-node-build-agent (split by platform)") {
		t.Errorf("raise report %+v does not say the seat-wide consumer was replaced", r)
	}
	if _, err := js.Publish(ctx(t), mesh.BuildSubject("linux/arm64"), []byte("arm"), jetstream.WithMsgID("arm")); err != nil {
		t.Fatal(err)
	}
	amd, err := js.Consumer(ctx(t), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer("linux/amd64"))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := amd.Info(ctx(t)); err != nil || info.NumPending != 0 {
		t.Fatalf("the amd64 consumer has %v pending (err %v), want none of the arm64 ask", info, err)
	}
	arm, err := js.Consumer(ctx(t), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer("linux/arm64"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := arm.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range b.Messages() {
		n++
		_ = m.Ack()
	}
	if n != 1 {
		t.Fatalf("the arm64 consumer delivered %d asks, want 1", n)
	}
}

func TestDockerfileOutside(t *testing.T) {
	for _, tc := range []struct {
		path, dockerfile, dir string
		outside               bool
	}{
		{"app", "", "", false},
		{"app", "Dockerfile", "", false},
		{"app", "docker/Dockerfile.prod", "", false},
		{"app", "./x/../Dockerfile", "", false},
		{"", "Dockerfile", "", false},
		{"app", "../docker/app.Dockerfile", "docker", true},
		{"app/", "../docker/app.Dockerfile", "docker", true},
		{"./services/api", "../../docker/api/Dockerfile", "docker/api", true},
		{"app", "../Dockerfile", "", true},
		{"app", "x/../../Dockerfile", "", true},
		{"a/b", "../Dockerfile", "a", true},
		// Back into the context: taken for beside it, its directory the
		// context's (the same tree, checked out once).
		{"app", "../app/Dockerfile", "app", true},
	} {
		dir, outside := mesh.DockerfileOutside(tc.path, tc.dockerfile)
		if dir != tc.dir || outside != tc.outside {
			t.Errorf("DockerfileOutside(%q, %q) = %q, %v; want %q, %v", tc.path, tc.dockerfile, dir, outside, tc.dir, tc.outside)
		}
	}
}
