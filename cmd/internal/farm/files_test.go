package farm

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/internal/natstest"
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
	ns, err := startNATS("127.0.0.1:0", filepath.Join(t.TempDir(), "nats"), keys, nofile, natsLogger{log: slog.New(slog.NewTextHandler(&logs, nil))})
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

// infoBurst asks the server at url n infos of stream at once, each listing
// the stream's subjects (requests of the JetStream API's info queue, each
// a walk of the stream's subjects), on one connection, and returns how
// many were answered.
func infoBurst(t *testing.T, url, stream string, n int) int {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	inbox := nc.NewInbox()
	answers := make(chan struct{}, n)
	sub, err := nc.Subscribe(inbox+".*", func(*nats.Msg) { answers <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	req := []byte(`{"subjects_filter":">"}`)
	for i := range n {
		if err := nc.PublishRequest("$JS.API.STREAM.INFO."+stream, inbox+"."+strconv.Itoa(i), req); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < n {
		select {
		case <-answers:
			got++
		case <-time.After(2 * time.Second):
			return got // nothing more for 2 s: the rest were dropped
		}
	}
	return got
}

// A server sized by queueForFleet holds the JetStream API requests of a
// fleet starting at once (mesh.FleetSettingsOf's APIQueueLimit): a burst
// of infos beyond nats-server's default queue of 10,000 is answered whole,
// where the default drops its whole queue when it fills ("JetStream API
// info queue limit reached, dropping 10000 requests", seen as 10,000
// machines started).
func TestAServerSizedForTheFleetAnswersItsStartBurst(t *testing.T) {
	if server.JSDefaultRequestQueueLimit != mesh.ServerAPIQueueLimit {
		t.Errorf("nats-server's default API queue is %d, mesh.ServerAPIQueueLimit %d", server.JSDefaultRequestQueueLimit, mesh.ServerAPIQueueLimit)
	}
	const n = mesh.ServerAPIQueueLimit * 3 / 2
	for _, sized := range []bool{false, true} {
		var opts server.Options
		if sized {
			queueForFleet(&opts)
		}
		s := natstest.Server(t, &opts)
		_, js := natstest.Connect(t, s)
		ctx := context.Background()
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "burst"})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 1000 {
			if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), nil); err != nil {
				t.Fatal(err)
			}
		}
		got := infoBurst(t, s.ClientURL(), mesh.KVStream("burst"), n)
		t.Logf("sized %v: %d of %d answered", sized, got, n)
		switch {
		case sized && got != n:
			t.Errorf("sized for the fleet: %d of %d infos asked at once were answered", got, n)
		case !sized && got == n:
			t.Errorf("nats-server's default queue answered all %d infos asked at once: the burst is too small to tell", n)
		}
		s.Shutdown()
	}
}
