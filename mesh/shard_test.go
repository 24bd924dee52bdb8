package mesh_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/mesh"
)

func TestFleetSettingsShards(t *testing.T) {
	for _, tc := range []struct{ machines, slots, want int }{
		{1, 1, 1}, {50, 1, 1}, {1000, 1, 1}, {mesh.ShardAbove, 1, 1},
		{mesh.ShardAbove + 1, 1, (mesh.ShardAbove + mesh.ShardPulls) / mesh.ShardPulls},
		{10_000, 1, 40}, {5_000, 2, 40}, {1_000_000, 1, mesh.MaxShards},
	} {
		if got := mesh.FleetSettingsOf(mesh.Fleet{Machines: tc.machines, Slots: tc.slots}).Shards; got != tc.want {
			t.Errorf("%d machines × %d slots: %d shards, want %d", tc.machines, tc.slots, got, tc.want)
		}
	}
}

// A seat of shards derives a consumer and a subject per platform and
// shard, none overlapping; shard 0 is the platform's own, so one shard is
// the seat without shards.
func TestShardedSeatDerivation(t *testing.T) {
	seat := mesh.Seat{Seat: mesh.BuildSeat, Accepts: []string{mesh.BuildVerb}}
	plain := mesh.SeatConsumerSpecs(seat, []string{mesh.DefaultPlatform}, 1)
	seat.Shards = 1
	if one := mesh.SeatConsumerSpecs(seat, []string{mesh.DefaultPlatform}, 1); len(one) != 1 || one[0].Config.Durable != plain[0].Config.Durable ||
		one[0].Config.FilterSubject != plain[0].Config.FilterSubject || one[0].Config.Metadata != nil {
		t.Fatalf("one shard derives %+v, want the seat without shards %+v", one, plain)
	}
	seat.Shards = 3
	specs := mesh.SeatConsumerSpecs(seat, []string{mesh.DefaultPlatform, "linux/arm64"}, 1)
	if len(specs) != 6 {
		t.Fatalf("3 shards × 2 platforms: %d consumers, want 6", len(specs))
	}
	var names, filters []string
	for _, cs := range specs {
		names = append(names, cs.Config.Durable)
		filters = append(filters, cs.Config.FilterSubject)
		if mesh.ShardsOfMetadata(cs.Config.Metadata) != 3 {
			t.Errorf("%s: metadata %v does not say 3 shards", cs.Config.Durable, cs.Config.Metadata)
		}
	}
	wantNames := []string{
		mesh.BuildConsumer(mesh.DefaultPlatform), mesh.BuildConsumer(mesh.DefaultPlatform) + "-s1", mesh.BuildConsumer(mesh.DefaultPlatform) + "-s2",
		mesh.BuildConsumer("linux/arm64"), mesh.BuildConsumer("linux/arm64") + "-s1", mesh.BuildConsumer("linux/arm64") + "-s2",
	}
	if !slices.Equal(names, wantNames) {
		t.Errorf("consumers %v, want %v", names, wantNames)
	}
	for i, f := range filters {
		if f != mesh.BuildShardSubject(platformOf(i), i%3) {
			t.Errorf("consumer %s filters %s, want %s", names[i], f, mesh.BuildShardSubject(platformOf(i), i%3))
		}
		if strings.ContainsAny(f, "*>") {
			t.Errorf("filter %s has a wildcard: shards would overlap", f)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(filters)))) != 6 {
		t.Errorf("filters repeat: %v", filters)
	}
	st, _ := mesh.SeatStreamSpec(seat, []string{mesh.DefaultPlatform, "linux/arm64"}, 1)
	for _, f := range filters {
		if !slices.Contains(st.Config.Subjects, f) {
			t.Errorf("the seat's stream does not take %s (its subjects %v)", f, st.Config.Subjects)
		}
	}
	// A seat that does not split by platform has no shards.
	if n := (mesh.Seat{Seat: "shop", Shards: 4}).ShardCount(); n != 1 {
		t.Errorf("a seat that does not split by platform has %d shards", n)
	}
}

func platformOf(i int) string {
	if i < 3 {
		return mesh.DefaultPlatform
	}
	return "linux/arm64"
}

// ShardOf keeps a machine's shard and spreads a fleet about evenly.
func TestShardOfSpreadsAFleet(t *testing.T) {
	const shards, machines = 40, 10_000
	count := make([]int, shards)
	for i := range machines {
		name := "vm-" + strconv.Itoa(i)
		k := mesh.ShardOf(name, shards)
		if k != mesh.ShardOf(name, shards) || k < 0 || k >= shards {
			t.Fatalf("ShardOf(%s) = %d, not a stable shard", name, k)
		}
		count[k]++
	}
	for k, n := range count {
		if n < machines/shards/2 || n > machines/shards*2 {
			t.Errorf("shard %d has %d of %d machines (want about %d)", k, n, machines, machines/shards)
		}
	}
	if mesh.ShardOf("anything", 1) != 0 || mesh.ShardOf("anything", 0) != 0 {
		t.Error("one shard (or none) is shard 0")
	}
}
