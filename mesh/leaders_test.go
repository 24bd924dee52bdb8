package mesh_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// On a cluster of three, a client connected to one server has the leaders
// of a replicated stream and of a consumer of it moved to that server; a
// stream of one replica, and a group whose leader is there already, are
// left alone; what it writes and consumes works after the move.
func TestLeadHereMovesTheLeadersToTheClientsServer(t *testing.T) {
	bus := natstest.Cluster(t, 3)
	_, admin := bus.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "HOT", Subjects: []string{"hot.>"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "ONE", Subjects: []string{"one.>"}, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The client on a server that does not lead the stream.
	here := -1
	for i := range bus.Len() {
		if bus.Server(i).Name() != info.Cluster.Leader {
			here = i
			break
		}
	}
	nc, err := nats.Connect(bus.Server(here).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := nc.ConnectedServerName()
	groups := []mesh.Group{{Stream: "HOT"}, {Stream: "HOT", Consumer: "reader"}, {Stream: "ONE"}}
	moved, err := mesh.LeadHere(ctx, nc, js, groups)
	if err != nil {
		t.Fatalf("LeadHere: %v", err)
	}
	if !slices.Contains(moved, groups[0]) || slices.Contains(moved, groups[2]) {
		t.Fatalf("moved %v: want the replicated stream, not the stream of one replica", moved)
	}
	for _, g := range groups[:2] {
		if lead, replicated, err := mesh.LeaderOf(ctx, js, g); err != nil || !replicated || lead != name {
			t.Fatalf("%s is led by %q (replicated %v, %v), want %s", g, lead, replicated, err, name)
		}
	}
	c, err := js.Consumer(ctx, "HOT", "reader")
	if err != nil {
		t.Fatal(err)
	}
	// Asked again: everything is here already.
	if again, err := mesh.LeadHere(ctx, nc, js, groups); err != nil || len(again) != 0 {
		t.Fatalf("LeadHere again moved %v (%v), want nothing", again, err)
	}
	if _, err := js.Publish(ctx, "hot.x", []byte("x")); err != nil {
		t.Fatalf("publishing after the move: %v", err)
	}
	msg, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil || string(msg.Data()) != "x" {
		t.Fatalf("consuming after the move: %v", err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
}

// One server: nothing is replicated, nothing moves, nothing fails.
func TestLeadHereOnOneServerDoesNothing(t *testing.T) {
	bus := natstest.Single(t)
	nc, js := bus.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "HOT", Subjects: []string{"hot.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "reader"}); err != nil {
		t.Fatal(err)
	}
	moved, err := mesh.LeadHere(ctx, nc, js, []mesh.Group{{Stream: "HOT"}, {Stream: "HOT", Consumer: "reader"}})
	if err != nil || len(moved) != 0 {
		t.Fatalf("moved %v (%v), want nothing and no error", moved, err)
	}
	// A group that does not exist is named in the error; the others are
	// looked at all the same.
	moved, err = mesh.LeadHere(ctx, nc, js, []mesh.Group{{Stream: "NOPE"}, {Stream: "HOT"}})
	if err == nil || !strings.Contains(err.Error(), "NOPE") || !errors.Is(err, jetstream.ErrStreamNotFound) || len(moved) != 0 {
		t.Fatalf("moved %v (%v), want an error naming NOPE, not found", moved, err)
	}
}
