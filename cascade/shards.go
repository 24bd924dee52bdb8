package cascade

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/meshbuild/meshbuild/mesh"
)

// A platform's queue split into shards (the build seat's `shards`, see
// mesh.ShardOf) has a holders' consumer per shard, each pulled from by its
// own machines. The controller publishes each ask to a shard with
// machines idle (route): at a look (ShardLook at most old, or the scheduler's
// look at idle holders) it reads each shard's consumer, and counts each ask
// it publishes after against its shard until the next look.

// ShardLook is how old a look at a platform's shards may be when the
// controller routes an ask to one.
const ShardLook = 100 * time.Millisecond

// shardView is what the controller knows of a platform's shards.
type shardView struct {
	at time.Time
	// load is each shard's asks queued less its pulls waiting at the
	// look (negative: machines idle), plus the asks published to it
	// since.
	load []int
	// live says a holder waited or worked on the shard at the look.
	live []bool
	next int // where the search for the least loaded starts
	// last is the shard the last ask went to (-1: none since the look).
	last int
}

// newShardView is a look at n shards before anything is known or sent.
func newShardView(n int) *shardView {
	return &shardView{load: make([]int, n), live: make([]bool, n), last: -1}
}

// holders is what the holders' consumers of one platform say, over its
// shards.
type holders struct {
	Waiting, Pending, AckPending int
	// Delivered is each shard's last stream sequence delivered.
	Delivered []uint64
}

// platformHolders reads every shard's consumer of platform p (one without
// shards has one) and takes the look for routing.
func (c *Controller) platformHolders(ctx context.Context, p string) (holders, error) {
	n := c.cat.BuildShards()
	stream := mesh.SeatStream(mesh.BuildSeat)
	infos := make([]*jetstream.ConsumerInfo, n)
	// Bound once each (here, on the controller's goroutine), then read at
	// once: a look at 40 shards one after the other held the controller
	// for 40 round trips.
	cons := make([]jetstream.Consumer, n)
	for k := range n {
		name := mesh.BuildShardConsumer(p, k)
		if c.seatConsumers[name] == nil {
			bctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			bound, err := c.js.Consumer(bctx, stream, name)
			cancel()
			if err != nil {
				return holders{}, err
			}
			c.seatConsumers[name] = bound
		}
		cons[k] = c.seatConsumers[name]
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(shardLooks)
	for k := range n {
		g.Go(func() error {
			ictx, cancel := context.WithTimeout(gctx, 2*time.Second)
			defer cancel()
			info, err := cons[k].Info(ictx)
			infos[k] = info
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return holders{}, err
	}
	h := holders{Delivered: make([]uint64, n)}
	v := newShardView(n)
	v.at = time.Now()
	for k, info := range infos {
		h.Waiting += info.NumWaiting
		h.Pending += int(info.NumPending)
		h.AckPending += info.NumAckPending
		h.Delivered[k] = info.Delivered.Stream
		v.load[k] = int(info.NumPending) - info.NumWaiting
		v.live[k] = info.NumWaiting > 0 || info.NumAckPending > 0
	}
	if old := c.shardViews[p]; old != nil {
		v.next, v.last = old.next, old.last
	}
	c.shardViews[p] = v
	return h, nil
}

// shardLooks is how many shards' consumers a look reads at once.
const shardLooks = 16

// shardFor routes an ask for platform p: shard 0 when its queue has no
// shards; otherwise as the look says (route), looked at again when it is
// older than ShardLook.
func (c *Controller) shardFor(ctx context.Context, p string) int {
	n := c.cat.BuildShards()
	if n <= 1 {
		return 0
	}
	v := c.shardViews[p]
	if v == nil || len(v.load) != n || time.Since(v.at) > ShardLook {
		if _, err := c.platformHolders(ctx, p); err != nil {
			// Routed by the last look (never looked: in turn), and
			// looked at again a ShardLook later, not at every ask.
			c.log.Warn("reading the shards of a platform's queue; routing by the last look", "platform", p, "err", err)
			if v == nil || len(v.load) != n {
				v = newShardView(n)
				c.shardViews[p] = v
			}
			v.at = time.Now()
		}
		v = c.shardViews[p]
	}
	return v.route()
}

// route picks the shard for the next ask by the look and counts the ask
// against it: the shard the last ask went to while machines there are
// idle; else the least loaded shard a holder is on (any shard when none
// is), ties taken in turn. A shard's consumer walks every pull waiting on
// it each time it runs dry (the server's processWaiting, an interest
// lookup for each), so asks that come together go to one shard and are
// delivered together, one walk for the lot; spread in turn over every
// shard they cost a walk each (at 10,000 machines in 40 shards, a third
// of the server's CPU).
func (v *shardView) route() int {
	n := len(v.load)
	if k := v.last; k >= 0 && k < n && v.live[k] && v.load[k] < 0 {
		v.load[k]++
		return k
	}
	best := -1
	for i := range n {
		k := (v.next + i) % n
		switch {
		case best < 0:
			best = k
		case v.live[k] != v.live[best]:
			if v.live[k] {
				best = k
			}
		case v.load[k] < v.load[best]:
			best = k
		}
	}
	v.load[best]++
	v.next = (best + 1) % n
	v.last = best
	return best
}

// delivered reports whether an ask published at seq to a shard may have
// been delivered at the look.
func (h holders) delivered(shard int, seq uint64) bool {
	return shard < len(h.Delivered) && seq <= h.Delivered[shard]
}

// adviseShards logs, once for each size it reaches, a platform whose
// machines (pulls waiting and asks held, at a look) want more shards than
// its queue has (mesh.FleetSettingsOf): each consumer then walks more
// waiting pulls each time it runs dry, and dispatch slows.
func (c *Controller) adviseShards(p string, slots int) {
	have, want := c.cat.BuildShards(), mesh.FleetSettingsOf(mesh.Fleet{Machines: slots, Slots: 1}).Shards
	if want <= have || c.shardAdvised[p] >= want {
		return
	}
	c.shardAdvised[p] = want
	c.log.Warn("the build seat's queue has too few shards for the machines holding it: write `shards: N` on the seat (mesh.FleetSettingsOf), raise the catalogue and issue the machines' credentials again",
		"platform", p, "machines", slots, "shards", have, "want", want)
}

// forgetAsk drops what the controller kept of an ask it published (its
// sequence, platform and shard, for a cancel) once the ask has its outcome:
// kept for ever they grew by every ask a long-running controller
// published.
func (c *Controller) forgetAsk(id string) {
	delete(c.askSeq, id)
	delete(c.askPlatform, id)
	delete(c.askShard, id)
}
