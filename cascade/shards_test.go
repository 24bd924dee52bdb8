package cascade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// A build seat split into shards, on a real server: each machine pulls
// from its own shard's consumer (mesh.ShardOf), and the controller
// publishes every ask to a shard with a machine on it — none to a shard
// nobody pulls from, where it would wait for ever — and the plan builds:
// with the default window (asks released as machines are idle) and with
// --window 0 (every ask at once, more than the machines idle).
func TestAShardedSeatRoutesAsksToTheShardsWithMachines(t *testing.T) {
	for _, window := range []int{cascade.DefaultConfig().Window, 0} {
		t.Run(fmt.Sprintf("window=%d", window), func(t *testing.T) { shardedRun(t, window) })
	}
}

func shardedRun(t *testing.T, window int) {
	const shards = 3
	graph := map[string][]string{"base": nil}
	for i := range 16 {
		graph[fmt.Sprintf("leaf-%02d", i)] = []string{"base"}
	}
	cat := mesh.NewCatalogue(meshtest.Sharded(meshtest.Catalogue(t, graph).Modules, shards))
	if cat.BuildShards() != shards {
		t.Fatalf("the catalogue's build seat has %d shards, want %d", cat.BuildShards(), shards)
	}
	s := natstest.Server(t, nil)
	nc, js := natstest.Connect(t, s)
	h := &harness{t: t, s: s, nc: nc, js: js, cat: cat, w: newWork()}
	h.startControllerWith(func(c *cascade.Config) { c.Window = window })
	for _, leaf := range []string{"leaf-00", "leaf-05", "leaf-10"} {
		h.w.sleep[leaf] = 200 * time.Millisecond
	}

	// Two machines on shard 0, two on shard 1, none on shard 2.
	per := map[int][]string{}
	for i := 1; len(per[0]) < 2 || len(per[1]) < 2; i++ {
		name := fmt.Sprintf("m%d", i)
		if k := mesh.ShardOf(name, shards); k < 2 && len(per[k]) < 2 {
			per[k] = append(per[k], name)
			h.startAgent(name)
		}
	}
	ctx := context.Background()
	info := func(k int) (waiting, delivered int) {
		c, err := h.js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildShardConsumer(mesh.DefaultPlatform, k))
		if err != nil {
			t.Fatalf("shard %d's consumer: %v", k, err)
		}
		i, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := mesh.ShardsOfMetadata(i.Config.Metadata); got != shards {
			t.Fatalf("shard %d's consumer says %d shards, want %d", k, got, shards)
		}
		return i.NumWaiting, int(i.Delivered.Consumer)
	}
	testenv.WaitFor(t, 10*time.Second, "each machine's pull waiting on its own shard", func() bool {
		w0, _ := info(0)
		w1, _ := info(1)
		w2, _ := info(2)
		return w0 == 2 && w1 == 2 && w2 == 0
	})

	plan := h.push("5ha4d5", "push-shards")
	rec, mods := h.settle(plan, 30*time.Second)
	if rec.Outcome != cascade.OutcomeBuilt {
		t.Fatalf("plan %s: %s, counts %+v", plan, rec.Outcome, rec.Counts)
	}
	machines := map[string]bool{}
	for _, names := range per {
		for _, n := range names {
			machines[n] = true
		}
	}
	for name, m := range mods {
		if !machines[m.On] {
			t.Errorf("%s built on %q, not one of the machines %v", name, m.On, per)
		}
	}
	_, d0 := info(0)
	_, d1 := info(1)
	_, d2 := info(2)
	if d2 != 0 {
		t.Errorf("shard 2, with no machine, was given %d asks", d2)
	}
	if d0 == 0 || d1 == 0 || d0+d1 != len(graph) {
		t.Errorf("shards 0 and 1 delivered %d and %d asks, want both some and %d in all", d0, d1, len(graph))
	}
}

// An ask left in a shard no machine pulls from — its one machine killed
// while building it, the ask delivered again there — is taken by a
// machine of another shard whose pull ended with nothing (agent
// stealFrom). Here the ask is published to shard 1 while the one machine
// is on shard 0.
func TestAnAskLeftInAShardWithNoMachineIsBuiltByAnother(t *testing.T) {
	const shards = 2
	cat := mesh.NewCatalogue(meshtest.Sharded(meshtest.Catalogue(t, map[string][]string{"a": nil}).Modules, shards))
	h := newHarnessOf(t, cat, 0)
	name := "m1"
	for i := 2; mesh.ShardOf(name, shards) != 0; i++ {
		name = fmt.Sprintf("m%d", i)
	}
	h.startAgent(name)
	ask := mesh.Ask{Version: mesh.AskVersion, ID: "left-1", Plan: "p-left", Module: "left",
		Source: mesh.Source{Repo: "https://git.example/x.git", Commit: "abc"}, Image: "127.0.0.1:1/left"}
	data, err := json.Marshal(ask)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.js.Publish(context.Background(), mesh.BuildShardSubject(mesh.DefaultPlatform, 1), data, jetstream.WithMsgID(ask.ID)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the ask left in shard 1 to be taken by "+name+" of shard 0", func() bool {
		return len(h.w.asksOf("left")) > 0
	})
}

// A cancel on a seat of shards: every ask still queued in any shard is
// withdrawn at once (whether a shard's consumer delivered it is read from
// that shard's own consumer), the ones building stop, and nothing is left
// in the queue.
func TestCancelWithdrawsTheAsksQueuedInEveryShard(t *testing.T) {
	const shards = 2
	graph := map[string][]string{"a": nil}
	for i := range 8 {
		graph[fmt.Sprintf("t%d", i)] = []string{"a"}
	}
	cat := mesh.NewCatalogue(meshtest.Sharded(meshtest.Catalogue(t, graph).Modules, shards))
	s := natstest.Server(t, nil)
	nc, js := natstest.Connect(t, s)
	h := &harness{t: t, s: s, nc: nc, js: js, cat: cat, w: newWork()}
	h.startControllerWith(func(c *cascade.Config) { c.Window = 0 })
	for m := range graph {
		h.w.sleep[m] = 3 * time.Second
	}
	h.w.sleep["a"] = 10 * time.Millisecond
	// Shard 0's machine has four slots, shard 1's one: shard 0's
	// consumer delivers asks published after those still queued in
	// shard 1, which only shard 1's consumer can say are undelivered.
	per := map[int]bool{}
	for i := 1; len(per) < shards; i++ {
		name := fmt.Sprintf("m%d", i)
		if k := mesh.ShardOf(name, shards); !per[k] {
			per[k] = true
			h.startAgentWith(name, func(c *agent.Config) { c.Slots = 4 - 3*k })
		}
	}
	plan := h.push("c2", "push-c2")
	testenv.WaitFor(t, 10*time.Second, "five dependents building", func() bool {
		mods, _ := h.store().Modules(context.Background(), plan)
		n := 0
		for _, m := range mods {
			if m.State == cascade.Building && m.Module != "a" {
				n++
			}
		}
		return n == 5
	})
	r, err := cascade.Call(context.Background(), h.nc, "build-controller", cascade.ToolCancel, cascade.Request{Plan: plan})
	if err != nil {
		t.Fatal(err)
	}
	if r.Record.Counts.Cancelling != 5 || r.Record.Counts.Cancelled != 3 {
		t.Errorf("right after the cancel: %+v, want 5 cancelling (building) and 3 cancelled (withdrawn from shard 1)", r.Record.Counts)
	}
	h.cancelledCleanly(plan, 8, 6) // a and the five in flight worked
}
