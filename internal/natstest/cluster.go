package natstest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ClusterName is the name of the clusters Cluster starts.
const ClusterName = "meshbuild"

// TestCluster is n in-process JetStream servers joined by routes, as
// nats-server's own cluster tests run them (createJetStreamClusterExplicit):
// each with a server name, a client and a route port on loopback, file
// storage in its own temp dir and `sync: always` (every write fsynced before
// it is acknowledged). Ports are fixed at start, so a stopped node comes
// back on the same address with the same store, and clients given URLs
// reconnect to it.
type TestCluster struct {
	tb   testing.TB
	mu   sync.Mutex
	opts []*server.Options
	srv  []*server.Server // nil while stopped
}

// Single starts one JetStream server (no cluster, `sync: always`) that can
// be stopped and restarted on the same port and store, as an operator
// restarts the embedded server of the default setup.
func Single(tb testing.TB) *TestCluster {
	tb.Helper()
	c := &TestCluster{tb: tb, srv: make([]*server.Server, 1)}
	c.opts = []*server.Options{{
		ServerName: "n1", Host: "127.0.0.1", Port: FreePorts(tb, 1)[0],
		JetStream: true, StoreDir: tb.TempDir(), SyncAlways: true, NoLog: true, NoSigs: true,
	}}
	tb.Cleanup(c.shutdown)
	if err := c.start(0); err != nil {
		tb.Fatal(err)
	}
	return c
}

// Cluster starts n servers and waits until they have elected a JetStream
// meta leader that sees every peer; they are shut down in cleanup.
func Cluster(tb testing.TB, n int) *TestCluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("natstest.Cluster: %d servers: want 1 or more", n)
	}
	clients, routes := FreePorts(tb, n), FreePorts(tb, n)
	var rs []string
	for _, p := range routes {
		rs = append(rs, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	c := &TestCluster{tb: tb, srv: make([]*server.Server, n)}
	for i := range n {
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1", Port: clients[i],
			JetStream: true, StoreDir: tb.TempDir(), SyncAlways: true,
			Cluster: server.ClusterOpts{Name: ClusterName, Host: "127.0.0.1", Port: routes[i]},
			Routes:  server.RoutesFromStr(strings.Join(rs, ",")),
			NoLog:   true, NoSigs: true,
		})
	}
	tb.Cleanup(c.shutdown)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = c.start(i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	c.WaitReady(n)
	return c
}

func (c *TestCluster) start(i int) error {
	o := *c.opts[i]
	s, err := server.NewServer(&o)
	if err != nil {
		return fmt.Errorf("nats server %s: %w", o.ServerName, err)
	}
	go s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		why := ""
		for _, p := range []int{o.Port, o.Cluster.Port} {
			if p > 0 {
				if h := holder(p); h != "" {
					why += "; port " + fmt.Sprint(p) + ": " + h
				}
			}
		}
		return fmt.Errorf("nats server %s not ready in 20s%s", o.ServerName, why)
	}
	c.mu.Lock()
	c.srv[i] = s
	c.mu.Unlock()
	return nil
}

func (c *TestCluster) shutdown() {
	for i := range c.srv {
		c.Stop(i)
	}
}

// Len is the number of servers, running or stopped.
func (c *TestCluster) Len() int { return len(c.opts) }

// URLs is every server's client URL, comma-separated, as nats.Connect takes
// them: a client reconnects to whichever is up.
func (c *TestCluster) URLs() string {
	var us []string
	for _, o := range c.opts {
		us = append(us, fmt.Sprintf("nats://%s:%d", o.Host, o.Port))
	}
	return strings.Join(us, ",")
}

// Server is node i, or nil while it is stopped.
func (c *TestCluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.srv[i]
}

// Stop shuts node i down (its store stays); stopping a stopped node does
// nothing.
func (c *TestCluster) Stop(i int) {
	c.mu.Lock()
	s := c.srv[i]
	c.srv[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart starts node i again on its ports and store; it returns once the
// node accepts connections (it may still be catching up on its streams).
func (c *TestCluster) Restart(i int) {
	c.tb.Helper()
	if c.Server(i) != nil {
		c.tb.Fatalf("natstest: restarting %s, which is running", c.opts[i].ServerName)
	}
	if err := c.start(i); err != nil {
		c.tb.Fatal(err)
	}
}

// WaitReady waits until a running server is the JetStream meta leader and
// sees peers servers as current.
func (c *TestCluster) WaitReady(peers int) {
	c.tb.Helper()
	if c.opts[0].Cluster.Name == "" {
		return // a single server is ready once it accepts connections
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		for i := range c.opts {
			s := c.Server(i)
			if s != nil && s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) >= peers && c.current(peers) {
				return
			}
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("natstest: the cluster has no JetStream meta leader with %d peers after 60s", peers)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// current reports whether at least want running servers are current with
// the meta leader.
func (c *TestCluster) current(want int) bool {
	n := 0
	for i := range c.opts {
		if s := c.Server(i); s != nil && s.JetStreamIsCurrent() {
			n++
		}
	}
	return n >= want
}

// Connect dials the cluster with every URL and returns a connection that
// reconnects forever (a node going away is expected) and its JetStream
// handle, closed in cleanup.
func (c *TestCluster) Connect(tb testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(c.URLs(), opts...)
	if err != nil {
		tb.Fatalf("connect %s: %v", c.URLs(), err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}
