package farm

import (
	"errors"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// A port the cluster picked and another process took before its server
// listened on it (here: the first attempt's route port of its second
// server) does not fail `builds up --cluster`: it is started again on other
// ports, and says so. A port taken on every attempt fails it, naming the
// port and the process that is not its own.
func TestAClusterPortTakenBeforeItsServerListensIsPickedAgain(t *testing.T) {
	keys, err := creds.Init(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Long enough for a server's start on a loaded machine, short enough
	// for the attempt whose port is taken.
	wait := clusterReadyWait
	clusterReadyWait = 8 * time.Second
	t.Cleanup(func() { clusterReadyWait, testHookPortsPicked = wait, nil })

	var attempts [][]int
	var held []net.Listener
	t.Cleanup(func() {
		for _, ln := range held {
			ln.Close()
		}
	})
	take := func(host string, port int) {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ln)
	}
	testHookPortsPicked = func(host string, clients, routes []int) {
		attempts = append(attempts, slices.Concat(clients, routes))
		if len(attempts) == 1 {
			take(host, routes[1])
		}
	}
	var log testenv.Buffer
	servers, urls, err := startNATSCluster("127.0.0.1:0", 3, t.TempDir(), keys, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		s.Shutdown()
		s.WaitForShutdown()
	}
	if len(attempts) != 2 || slices.Contains(attempts[1], attempts[0][4]) {
		t.Fatalf("attempts %v: want a second on other ports than the taken %d", attempts, attempts[0][4])
	}
	if urls == "" || !strings.Contains(log.String(), "starting the NATS cluster again on other ports") ||
		!strings.Contains(log.String(), "meshbuild-n2 did not start: port "+strconv.Itoa(attempts[0][4])+" taken by another process") {
		t.Errorf("urls %q, log:\n%s", urls, log.String())
	}

	// Taken on every attempt: the error names it.
	clusterReadyWait = 2 * time.Second // no attempt is to start
	attempts = nil
	testHookPortsPicked = func(host string, clients, routes []int) {
		attempts = append(attempts, slices.Concat(clients, routes))
		take(host, clients[0])
	}
	_, _, err = startNATSCluster("127.0.0.1:0", 3, t.TempDir(), keys, slog.New(slog.NewTextHandler(&log, nil)))
	var taken *portsTakenError
	if !errors.As(err, &taken) || len(attempts) != 3 || taken.server != "meshbuild-n1" || !slices.Equal(taken.ports, []int{attempts[2][0]}) {
		t.Fatalf("after %d attempts: %v, want meshbuild-n1's port %v taken", len(attempts), err, attempts)
	}
}
