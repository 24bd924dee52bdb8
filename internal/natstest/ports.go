package natstest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// ephemeralRange is the kernel's range of ephemeral ports
// (net.ipv4.ip_local_port_range): where a listener on port 0 is put, and
// where connect picks the source port of every outgoing connection.
func ephemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999 // Linux's default
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l > h {
		return lo, hi
	}
	return l, h
}

// portPool is where free ports are looked for: the 16,384 ports below the
// ephemeral range, or above it when there is no room below.
//
// A port a test stops and starts again (a cluster node, `builds up`
// restarted on its address) must not be in the ephemeral range: while it is
// free, any outgoing connection on the machine — a client reconnecting to
// another node, an HTTP request of a test running in parallel — may be
// given it as its source port, and the restart then fails with "address
// already in use" for as long as that connection lives.
func portPool() (lo, hi int) {
	elo, ehi := ephemeralRange()
	const size = 16384
	if elo-size >= 1024 {
		return elo - size, elo - 1
	}
	if elo > 2048 {
		return 1024, elo - 1
	}
	return ehi + 1, min(ehi+size, 65535)
}

// FreePortRun is the first of n consecutive loopback ports that are free,
// picked at random from outside the ephemeral range (see portPool) and
// reserved for this process (reserve).
func FreePortRun(tb testing.TB, n int) int {
	tb.Helper()
	lo, hi := portPool()
	if hi-lo+1 < n {
		tb.Fatalf("natstest: no room for %d ports in %d-%d", n, lo, hi)
	}
next:
	for range 200 {
		p := lo + rand.IntN(hi-lo+2-n)
		for i := range n {
			if holder(p+i) != "" {
				continue next
			}
		}
		if !reserve(p, n) {
			continue
		}
		return p
	}
	tb.Fatalf("natstest: no %d free ports in a row in %d-%d after 200 tries", n, lo, hi)
	return 0
}

// FreePorts is n distinct free loopback ports, picked at random from
// outside the ephemeral range (see portPool).
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	var ports []int
	seen := map[int]bool{}
	for len(ports) < n {
		p := FreePortRun(tb, 1)
		if !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return ports
}

// holder says why port p cannot be listened on, "" when it can.
func holder(p int) string {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		return err.Error()
	}
	ln.Close()
	return ""
}

// reserve reserves ports p … p+n-1 for this process for as long as it
// lives (an exclusive flock on a file per port, released by the kernel
// when the process ends), and reports false when another process holds one
// of them. A port free when it is picked may be a stopped node's, about to
// be listened on again: `go test ./...` runs packages in parallel
// processes, and one of them picking the port of another's node stopped
// for a restart made that restart fail with "address already in use" for
// as long as its own server lived (fresh-clone CI, cascade
// TestClusterPlanSurvivesANodeRestart).
func reserve(p, n int) bool {
	dir := filepath.Join(os.TempDir(), "meshbuild-natstest-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true // nowhere to reserve: the port is free, as far as can be known
	}
	var held []*os.File
	for i := range n {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p+i)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return true
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			for _, h := range held {
				h.Close() // closing the file releases its lock
			}
			return false
		}
		held = append(held, f)
	}
	reserved.Lock()
	reserved.files = append(reserved.files, held...)
	reserved.Unlock()
	return true
}

// reserved keeps the files whose locks reserve a process's ports open (and
// so locked) for as long as the process lives.
var reserved struct {
	sync.Mutex
	files []*os.File
}
