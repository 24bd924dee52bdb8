package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// An arm64 ask is never delivered to an amd64 machine — it sits in the
// arm64 queue, undelivered, while the amd64 machine works other asks — and
// is built, first delivery, by the arm64 machine when it arrives. A machine
// of both platforms takes asks of either.
func TestAnAskIsTakenOnlyByAMachineOfItsPlatform(t *testing.T) {
	s, js := bus(t)
	ctx := context.Background()
	ms := meshtest.MeshManifests(t)
	ms = append(ms, &mesh.Manifest{Module: "tool", Build: &mesh.Build{Repo: meshtest.FleetRepo, Path: "tool", Platforms: []string{"linux/amd64", "linux/arm64"}}})
	if _, err := mesh.Raise(ctx, js, mesh.NewCatalogue(ms), 1); err != nil {
		t.Fatal(err)
	}
	publish := func(a mesh.Ask) {
		t.Helper()
		data, _ := json.Marshal(a)
		if _, err := js.Publish(ctx, mesh.BuildSubject(a.Platform), data, jetstream.WithMsgID(a.ID)); err != nil {
			t.Fatal(err)
		}
	}
	g := newGate()
	x86 := startAgent(t, s, "x86", g.on("x86"), func(c *agent.Config) { c.Platforms = []string{"linux/amd64"} })
	arm := ask("arm-1")
	arm.Platform = "linux/arm64"
	publish(arm)
	amd := ask("amd-1")
	amd.Platform = "linux/amd64"
	publish(amd)
	// The amd64 machine pulls and works: it takes its own ask, not the
	// arm64 one queued before it.
	if got := recv(t, g.began, 5*time.Second); got != "amd-1" {
		t.Fatalf("x86 began %s, want amd-1", got)
	}
	g.ch("amd-1") <- nil
	armCons, err := js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer("linux/arm64"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := armCons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 1 || info.Delivered.Consumer != 0 || info.NumAckPending != 0 {
		t.Fatalf("arm64 queue: pending %d, delivered %d, ack pending %d; want the ask there, never delivered",
			info.NumPending, info.Delivered.Consumer, info.NumAckPending)
	}

	pi := startAgent(t, s, "pi", g.on("pi"), func(c *agent.Config) { c.Platforms = []string{"linux/arm64/v8"} })
	if got := recv(t, g.began, 10*time.Second); got != "arm-1" {
		t.Fatalf("pi began %s, want arm-1", got)
	}
	g.ch("arm-1") <- nil

	waitBuilt(t, js, "arm-1", "amd-1")

	// A machine of both takes either.
	for _, ra := range []*runningAgent{x86, pi} {
		ra.cancel()
		<-ra.done
	}
	startAgent(t, s, "both", g.on("both"), func(c *agent.Config) { c.Platforms = []string{"linux/arm64", "linux/amd64"} })
	for _, id := range []string{"arm-2", "amd-2"} {
		a := ask(id)
		a.Platform = map[string]string{"arm-2": "linux/arm64", "amd-2": "linux/amd64"}[id]
		publish(a)
	}
	for range 2 {
		id := recv(t, g.began, 10*time.Second)
		g.ch(id) <- nil
	}
	waitBuilt(t, js, "arm-2", "amd-2")
	r := events(t, js)
	for _, b := range r.Built {
		switch {
		case b.Ask == "arm-1" && b.On != "pi":
			t.Errorf("arm-1 built on %s", b.On)
		case b.Ask == "amd-1" && b.On != "x86":
			t.Errorf("amd-1 built on %s", b.On)
		}
	}
	for _, st := range r.Started {
		if st.Ask == "arm-1" && (st.On != "pi" || st.Attempt != 1) {
			t.Errorf("arm-1 started on %s attempt %d, want pi, first delivery", st.On, st.Attempt)
		}
	}
}

// ChoosePlatforms takes the worker's platforms, or narrows them, and
// refuses a platform the worker does not build, naming what it does.
func TestPlatformsComeFromTheWorkerAndNarrow(t *testing.T) {
	worker := []string{"linux/386", "linux/amd64", "linux/arm64"}
	if got, err := agent.ChoosePlatforms(worker, nil); err != nil || len(got) != 3 {
		t.Fatalf("no --platforms: %v %v, want the worker's", got, err)
	}
	if got, err := agent.ChoosePlatforms(worker, []string{"linux/arm64/v8"}); err != nil || len(got) != 1 || got[0] != "linux/arm64" {
		t.Fatalf("narrowed: %v %v", got, err)
	}
	_, err := agent.ChoosePlatforms(worker, []string{"linux/s390x"})
	if !errors.Is(err, agent.ErrConfig) {
		t.Fatalf("a platform the worker lacks: %v, want ErrConfig", err)
	}
	t.Log(err)
}

// waitBuilt waits until a built event of each ask is in EVENTS.
func waitBuilt(t *testing.T, js jetstream.JetStream, asks ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, mesh.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventBuilt)}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, a := range asks {
		want[a] = true
	}
	for len(want) > 0 {
		m, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatalf("waiting for built of %v: %v", want, err)
		}
		var b mesh.Built
		_ = json.Unmarshal(m.Data(), &b)
		delete(want, b.Ask)
	}
}
