package natstest

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortsAreOutsideTheEphemeralRange: every port handed out can be
// listened on and lies outside the kernel's ephemeral range, where the
// source port of an outgoing connection is picked from; a run of n is n
// consecutive free ports.
func TestFreePortsAreOutsideTheEphemeralRange(t *testing.T) {
	elo, ehi := ephemeralRange()
	seen := map[int]bool{}
	for _, p := range FreePorts(t, 50) {
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p >= elo && p <= ehi {
			t.Fatalf("port %d is in the ephemeral range %d-%d", p, elo, ehi)
		}
	}
	first := FreePortRun(t, 3)
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(first+i))
		if err != nil {
			t.Fatalf("port %d of the run from %d: %v", first+i, first, err)
		}
		defer ln.Close()
	}
	// An outgoing connection's source port is in the ephemeral range, and
	// it is what a port from it could collide with.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.LocalAddr().(*net.TCPAddr).Port; p < elo || p > ehi {
		t.Fatalf("an outgoing connection's source port %d is outside %d-%d: the range read is not the kernel's", p, elo, ehi)
	}
}
