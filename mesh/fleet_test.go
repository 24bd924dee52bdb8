package mesh_test

import (
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// The settings grow with the fleet as SCALE.md measured them: MaxWaiting a
// quarter above machines × slots, the open files a descriptor per machine
// beside the other connections and the server's files; every holders'
// consumer is raised with the default fleet's.
func TestFleetSettingsOf(t *testing.T) {
	for _, c := range []struct {
		f          mesh.Fleet
		maxWaiting int
		noFile     uint64
		fetchWait  time.Duration
		apiQueue   int
	}{
		{mesh.Fleet{Machines: 1000, Slots: 1}, 1250, 2280, 10 * time.Second, 18_000},
		{mesh.Fleet{Machines: 1000, Slots: 4}, 5000, 2280, 40 * time.Second, 18_000}, // infos are per machine
		{mesh.Fleet{Machines: 10_000, Slots: 1}, 12_500, 11_280, 100 * time.Second, 180_000},
		{mesh.Fleet{Machines: 500, Slots: 1}, 625, 1780, 5 * time.Second, 10_000},               // never below the server's default
		{mesh.Fleet{Machines: 3, Slots: 1}, 4, 1283, 5 * time.Second, mesh.ServerAPIQueueLimit}, // rounded up
		{mesh.Fleet{}, 2, 1281, 5 * time.Second, mesh.ServerAPIQueueLimit},                      // at least one machine of one slot
	} {
		got := mesh.FleetSettingsOf(c.f)
		if got.MaxWaiting != c.maxWaiting || got.NoFile != c.noFile || got.FetchWait != c.fetchWait || got.APIQueueLimit != c.apiQueue {
			t.Errorf("FleetSettingsOf(%+v) = %+v, want MaxWaiting %d, NoFile %d, FetchWait %s, APIQueueLimit %d", c.f, got, c.maxWaiting, c.noFile, c.fetchWait, c.apiQueue)
		}
		// Each pull waiting costs the server two events (its heartbeat
		// and its expiry) a FetchWait once it is 10 s or more, one below:
		// the fleet's stay near FleetPullEvents a second.
		events := 1.0
		if got.FetchWait >= 10*time.Second {
			events = 2
		}
		if rate := events * float64(max(c.f.Machines, 1)*max(c.f.Slots, 1)) / got.FetchWait.Seconds(); rate > mesh.FleetPullEvents {
			t.Errorf("FleetSettingsOf(%+v): %.0f pull events a second, more than %d", c.f, rate, mesh.FleetPullEvents)
		}
	}
	want := mesh.FleetSettingsOf(mesh.DefaultFleet).MaxWaiting
	seat := mesh.Seat{Seat: mesh.BuildSeat, Accepts: []string{mesh.BuildVerb}}
	for _, cs := range mesh.SeatConsumerSpecs(seat, []string{mesh.DefaultPlatform, "linux/arm64"}, 1) {
		if cs.Config.MaxWaiting != want {
			t.Errorf("%s: MaxWaiting %d, want %d", cs.Config.Durable, cs.Config.MaxWaiting, want)
		}
	}
}

// A server given the open files limit a fleet needs has room for the
// fleet's machines; one below it caps its connections below the limit,
// leaving its own files the descriptors they need.
func TestConnectionsFor(t *testing.T) {
	for _, m := range []int{0, 1, 3, 767, 768, 769, 1000, 1100, 10_000, 100_000} {
		need := mesh.FleetSettingsOf(mesh.Fleet{Machines: m, Slots: 1}).NoFile
		if got := mesh.MachinesFor(need); got < m {
			t.Errorf("MachinesFor(%d), the limit %d machines need = %d: fewer than the %d", need, m, got, m)
		}
		if c := mesh.ConnectionsFor(need); uint64(c) >= need {
			t.Errorf("ConnectionsFor(%d) = %d: no descriptor left for the server's own files", need, c)
		}
	}
	for _, c := range []struct {
		nofile uint64
		conns  int
	}{{1024, 512}, {2048, 1024}, {2049, 1025}, {11_280, 10_256}, {40, 20}, {0, 0}} {
		if got := mesh.ConnectionsFor(c.nofile); got != c.conns {
			t.Errorf("ConnectionsFor(%d) = %d, want %d", c.nofile, got, c.conns)
		}
	}
	if got := mesh.MachinesFor(1024); got != 256 {
		t.Errorf("MachinesFor(1024) = %d, want 256", got)
	}
}
