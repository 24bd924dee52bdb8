package farm

import (
	"log/slog"
	"strconv"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshbuild/meshbuild/mesh"
)

// openFiles is this process's open files limit (RLIMIT_NOFILE; Go raises
// the soft limit to the hard one as a program starts), 0 when it cannot
// be read.
func openFiles() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0
	}
	return l.Cur
}

// capConnections gives an embedded server, one of servers in this process
// (they share its open files), the client connections its share of nofile
// has room for beside its own files (mesh.ConnectionsFor): a machine
// beyond them is refused "maximum connections exceeded" instead of the
// server running out of descriptors and stopping its streams. It says so
// when that is fewer machines than the fleet the holders' consumers are
// raised for (mesh.DefaultFleet), with the limit that fleet needs.
func capConnections(opts *server.Options, nofile uint64, servers int, log *slog.Logger) {
	if nofile == 0 {
		return
	}
	share := nofile / uint64(max(servers, 1))
	opts.MaxConn = mesh.ConnectionsFor(share)
	need := mesh.FleetSettingsOf(mesh.DefaultFleet).NoFile * uint64(max(servers, 1))
	if machines := mesh.MachinesFor(share); machines < mesh.DefaultFleet.Machines {
		log.Warn("the open files limit leaves room for fewer machines than the fleet the seat is raised for; "+
			"a machine beyond them is refused (maximum connections exceeded)",
			"open_files", nofile, "max_connections", opts.MaxConn, "machines", machines,
			"fleet", mesh.DefaultFleet.Machines, "fix", "raise ulimit -n (LimitNOFILE) to at least "+strconv.FormatUint(need, 10))
	}
}

// queueForFleet gives an embedded server the JetStream API queue the
// fleet the seat is raised for (mesh.DefaultFleet) needs when it starts at
// once (mesh.FleetSettingsOf's APIQueueLimit; the info queue takes it):
// on the server's default a full queue drops every request in it.
func queueForFleet(opts *server.Options) {
	opts.JetStreamRequestQueueLimit = int64(mesh.FleetSettingsOf(mesh.DefaultFleet).APIQueueLimit)
}
