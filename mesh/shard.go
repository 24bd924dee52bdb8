package mesh

import (
	"hash/fnv"
	"strconv"
)

// A platform's queue of the build seat may be split into shards (the
// seat's `shards`): shard k has its own subject and its own holders'
// consumer, a machine pulls from the one shard ShardOf gives it, and the
// controller publishes each ask to a shard that has a machine idle. The
// server walks every pull waiting on a consumer each time the consumer runs
// dry — a look-up of each one's interest — so with 10,000 machines on one
// consumer every ask cost two walks of 10,000 and dispatch p50 was 3.3 ms
// (issue #23); a shard's consumer walks only its own machines' pulls.
// Shard 0 is the unsplit queue (its subject and consumer are the
// platform's), so a seat of one shard is exactly a seat without shards.

// MaxShards is the most shards a platform's queue splits into.
const MaxShards = 64

// ShardAbove is the most pulls one consumer serves well: at 1,000 machines
// on one consumer dispatch p99 was 1.5 ms and 2,300 modules/s went through
// (BENCHMARKS.md); at 10,000, 7.8 ms and 1,900/s. Beyond it a platform's
// queue splits into shards of ShardPulls (FleetSettingsOf's Shards).
const ShardAbove = 2500

// ShardPulls is how many waiting pulls each shard's consumer is sized for
// once a fleet is beyond ShardAbove. Measured at 10,000 machines on one
// server (cascade BenchmarkFleet1000, MESHBUILD_FLEET_SHARDS): 4 shards
// of 2,500 dispatched at p99 2.6 ms but took 1,500 modules/s, fewer than
// one consumer (its wake-ups merge under load, one walk serving many asks;
// a shard's do not, so each pull that arrives costs a walk of its shard);
// 10 of 1,000: 1.7 ms, 1,600–1,800/s; 20 of 500: 1.2 ms, 2,065/s; 40 of
// 250: 2.6 ms, 2,290/s. Those runs had the controller spread asks over
// the shards one by one; since it fills one shard while its machines are
// idle (cascade's shardView.route, one walk for a burst of asks), the
// shard count matters less: 4 shards 2.8 ms, 2,160/s; 10: 1.9 ms,
// 2,421/s; 20: 1.7 ms, 2,393/s; 40: 1.6–3.7 ms, 2,249–2,511/s; 64:
// 2.1 ms, 2,281/s (one run each, 2026-12-06; the host moves these by a
// tenth).
const ShardPulls = 250

// ShardsMetadata is the key of a holders' consumer's metadata that says
// how many shards its platform's queue has: a machine binding the
// platform's consumer (shard 0) reads it there and moves to its own shard.
const ShardsMetadata = "meshbuild.shards"

// ShardCount is how many shards seat s's queue of each platform has: its
// Shards for a seat that splits by platform, otherwise 1.
func (s Seat) ShardCount() int {
	if !SplitsByPlatform(s.Seat) || s.Shards < 1 {
		return 1
	}
	return min(s.Shards, MaxShards)
}

// shardSuffix is shard k's token ("s3"); shard 0 has none.
func shardSuffix(shard int) string {
	if shard <= 0 {
		return ""
	}
	return "s" + strconv.Itoa(shard)
}

// SeatShardSubject is where work asking seat s to do verb v for a platform
// is published in shard k: the platform's subject for shard 0, with a
// token for the shard after it otherwise
// (mesh.seat.node-build-agent.accept.build.linux-amd64.s3).
func SeatShardSubject(seat, verb, platform string, shard int) string {
	if shard <= 0 {
		return SeatPlatformSubject(seat, verb, platform)
	}
	return SeatPlatformSubject(seat, verb, platform) + "." + shardSuffix(shard)
}

// SeatShardConsumer is the holders' consumer of shard k of a platform's
// queue: the platform's consumer for shard 0 (holders-node-build-agent-
// linux-amd64), "-s3" after it for shard 3.
func SeatShardConsumer(seat, platform string, shard int) string {
	if shard <= 0 {
		return SeatPlatformConsumer(seat, platform)
	}
	return SeatPlatformConsumer(seat, platform) + "-" + shardSuffix(shard)
}

// BuildShardSubject is where a build ask for a platform is published in
// shard k.
func BuildShardSubject(platform string, shard int) string {
	return SeatShardSubject(BuildSeat, BuildVerb, platform, shard)
}

// BuildShardConsumer is the build seat's holders' consumer of shard k of a
// platform.
func BuildShardConsumer(platform string, shard int) string {
	return SeatShardConsumer(BuildSeat, platform, shard)
}

// ShardOf is the shard machine pulls from when its platform's queue has
// shards: a hash of its name, so that a machine keeps its shard across
// restarts and a fleet spreads about evenly.
func ShardOf(machine string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(machine))
	return int(h.Sum32() % uint32(shards))
}

// ShardsOfMetadata is how many shards a holders' consumer's metadata says
// its platform's queue has (1 when it says nothing).
func ShardsOfMetadata(md map[string]string) int {
	n, err := strconv.Atoi(md[ShardsMetadata])
	if err != nil || n < 1 {
		return 1
	}
	return min(n, MaxShards)
}

// BuildShards is how many shards the catalogue's build seat splits each
// platform's queue into.
func (c *Catalogue) BuildShards() int {
	s, _, ok := c.Seat(BuildSeat)
	if !ok {
		return 1
	}
	return s.ShardCount()
}
