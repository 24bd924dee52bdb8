package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// A seat's consumer made before with a MaxWaiting below the fleet's need
// (4 pulls) on a real server: the raise keeps it (the server cannot change
// it) and says so; a machine of 4 slots fills it; the next machine, whose
// pull the server would drop without a word to a Consume, refuses to start
// with ErrNoRoom naming the consumer and what it needs.
func TestHolderRefusedWhenMaxWaitingIsFull(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cat := meshtest.Catalogue(t, nil)
	seat := mesh.Seat{Seat: mesh.BuildSeat, Accepts: []string{mesh.BuildVerb}}
	stream, ok := mesh.SeatStreamSpec(seat, cat.Platforms(), 1)
	if !ok {
		t.Fatal("the build seat has no stream")
	}
	if _, err := js.CreateStream(ctx, stream.Config); err != nil {
		t.Fatal(err)
	}
	small := mesh.SeatConsumerSpecs(seat, cat.Platforms(), 1)[0]
	small.Config.MaxWaiting = 4
	if _, err := js.CreateConsumer(ctx, small.Stream, small.Config); err != nil {
		t.Fatal(err)
	}
	r, err := mesh.Raise(ctx, js, cat, 1)
	if err != nil {
		t.Fatalf("raise over a short consumer: %v", err)
	}
	if len(r.Short) != 1 || !strings.Contains(r.Short[0], small.Config.Durable) || !strings.Contains(r.Short[0], "MaxWaiting 4") {
		t.Errorf("raise report short %q: want the one consumer with MaxWaiting 4", r.Short)
	}

	start := func(machine string, slots int) chan error {
		cfg := agent.DefaultConfig()
		cfg.Machine, cfg.Slots, cfg.FetchWait = machine, slots, 5*time.Second
		a, err := agent.New(cfg, js, newGate().on(machine), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		return done
	}
	first := start("m1", 4)
	cons, err := js.Consumer(ctx, small.Stream, small.Config.Durable)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the first machine's 4 pulls wait", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting == 4
	})
	select {
	case err := <-start("m2", 1):
		if !errors.Is(err, agent.ErrNoRoom) || !strings.Contains(err.Error(), "MaxWaiting 4") {
			t.Errorf("the second machine: %v, want ErrNoRoom naming MaxWaiting 4", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the second machine started on a full consumer: its pull would be dropped")
	}
	cancel()
	if err := <-first; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("the first machine: %v", err)
	}
}
