package agent

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// A platform's queue split into shards (mesh.ShardOf): the machine pulls
// from its own shard, and the controller publishes each ask to a shard
// with a machine idle on it. An ask can still be left in a shard nobody
// pulls from: its one machine killed while building it (the ask is
// delivered again in that shard once its ack wait is out), or every
// machine of it gone after the controller published. So a slot whose pull
// ended with nothing takes one waiting ask, if there is one, from another
// shard of the platform before it pulls again: the shards in turn, a pull
// that does not wait (the server answers an empty shard at once, without
// walking its waiting pulls). At 10,000 machines with pulls of 100 s that
// is a hundred looks a second over the fleet, each shard looked at a few
// times a second.

// stealWait bounds binding another shard's consumer.
const stealWait = 2 * time.Second

// stealFrom is the consumer of the next other shard of the turn-th bound
// consumer's platform, bound on first use; nil when that platform's queue
// has no shards (or the consumer cannot be bound now).
func (a *Agent) stealFrom(ctx context.Context, b *bound, turn int) jetstream.Consumer {
	b.mu.Lock()
	if len(b.cons) == 0 {
		b.mu.Unlock()
		return nil
	}
	i := turn % len(b.cons)
	n, own, platform := b.shards[i], b.own[i], b.platforms[i]
	if n <= 1 {
		b.mu.Unlock()
		return nil
	}
	k := (own + 1 + b.stole[i]%(n-1)) % n
	b.stole[i]++
	name := mesh.BuildShardConsumer(platform, k)
	cons := b.steals[name]
	b.mu.Unlock()
	if cons != nil {
		return cons
	}
	bctx, cancel := context.WithTimeout(ctx, stealWait)
	defer cancel()
	cons, err := a.js.Consumer(bctx, mesh.SeatStream(mesh.BuildSeat), name)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Debug("cannot bind another shard's consumer to take a left ask from", "consumer", name, "err", err)
		}
		return nil
	}
	b.mu.Lock()
	if b.steals == nil {
		b.steals = map[string]jetstream.Consumer{}
	}
	b.steals[name] = cons
	b.mu.Unlock()
	return cons
}
