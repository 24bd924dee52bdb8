package natstest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
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

// TestAPortReservedByAnotherProcessIsNotHandedOut: a port another test
// process reserved (a node of its cluster, stopped for a restart: nothing
// listens on it) is refused here while that process lives, and free again
// once it has ended. Before, `go test ./...` once gave a stopped node's
// port to a server of another package, and the node's restart failed with
// "address already in use".
func TestAPortReservedByAnotherProcessIsNotHandedOut(t *testing.T) {
	if os.Getenv("NATSTEST_RESERVE") != "" {
		// The other process: a port picked and reserved, held until the
		// parent closes stdin.
		fmt.Println(FreePortRun(t, 1))
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	port := FreePortRun(t, 1)
	cmd := exec.Command(os.Args[0], "-test.run=^TestAPortReservedByAnotherProcessIsNotHandedOut$")
	cmd.Env = append(os.Environ(), "NATSTEST_RESERVE=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	other, cerr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || cerr != nil {
		t.Fatalf("the other process: %q %v %v", line, err, cerr)
	}
	if h := holder(other); h != "" {
		t.Fatalf("port %d is listened on (%s); the test wants it free and reserved", other, h)
	}
	if reserve(other, 1) {
		t.Fatalf("port %d, reserved by another process, was reserved here too", other)
	}
	if reserve(port, 1) {
		t.Fatalf("port %d, handed out to this process, was reserved again", port)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if !reserve(other, 1) {
		t.Fatalf("port %d is still refused after the process that reserved it ended", other)
	}
}
