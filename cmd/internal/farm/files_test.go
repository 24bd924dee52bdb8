package farm

import (
	"errors"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// The embedded server takes the connections its open files limit has room
// for beside its own files, and refuses the next with "maximum connections
// exceeded" (its streams go on); a limit that leaves room for fewer
// machines than the fleet the seat is raised for is said at start, with
// the limit that fleet needs.
func TestAnEmbeddedServerCapsItsConnectionsByItsOpenFiles(t *testing.T) {
	keys, err := creds.Init(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer // the server logs from its own goroutines
	const nofile = 40
	ns, err := startNATS("127.0.0.1:0", filepath.Join(t.TempDir(), "nats"), keys, nofile, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	want := mesh.ConnectionsFor(nofile)
	if !strings.Contains(logs.String(), "max_connections="+strconv.Itoa(want)) || !strings.Contains(logs.String(), "ulimit -n") {
		t.Errorf("the start did not say the cap and the limit to raise:\n%s", logs.String())
	}

	cat := meshtest.Catalogue(t, map[string][]string{"a": nil})
	p, err := cat.PrincipalPermissions(mesh.KindOperator, "")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "op.creds")
	if err := keys.IssueFile(p, "operator", path); err != nil {
		t.Fatal(err)
	}
	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	for i := range want {
		nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(path), nats.MaxReconnects(0))
		if err != nil {
			t.Fatalf("connection %d of the %d the limit has room for: %v", i+1, want, err)
		}
		conns = append(conns, nc)
	}
	// The server answers "maximum connections exceeded" and closes; the
	// client hears the answer or, when it was still writing, the close.
	if nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(path), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatalf("connection %d beyond the cap of %d admitted", want+1, want)
	} else if !errors.Is(err, nats.ErrMaxConnectionsExceeded) && !strings.Contains(logs.String(), "maximum connections exceeded") {
		t.Errorf("connection %d refused with %v, and the server did not say why", want+1, err)
	}
	// A daemon refused says why and what to raise, whether it heard the
	// server's answer or only its close.
	nc, _, err := daemon.Connect(ns.ClientURL(), path, mesh.OperatorPrincipal, "builds")
	if err == nil {
		nc.Close()
		t.Fatal("daemon.Connect beyond the cap admitted")
	}
	if msg := err.Error(); !strings.Contains(msg, "no room for another connection") || !strings.Contains(msg, "ulimit -n") {
		t.Errorf("daemon.Connect beyond the cap: %v; want it to say there is no room and the limit to raise", err)
	}
	// Those admitted still work.
	for i, nc := range conns {
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			t.Errorf("connection %d after the refusal: %v", i+1, err)
		}
	}
}
