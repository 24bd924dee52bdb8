// Package natstest starts a real, embedded NATS JetStream server for tests:
// loopback, a random port, file storage in the test's temp dir, shut down in
// cleanup.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server starts a JetStream server. Options in opts (users, accounts) are
// applied on top of the defaults; opts may be nil.
func Server(tb testing.TB, opts *server.Options) *server.Server {
	tb.Helper()
	o := server.Options{}
	if opts != nil {
		o = *opts
	}
	o.Host = "127.0.0.1"
	if o.Port == 0 {
		o.Port = -1
	}
	o.JetStream = true
	if o.StoreDir == "" {
		o.StoreDir = tb.TempDir()
	}
	o.NoLog, o.NoSigs = true, true
	s, err := server.NewServer(&o)
	if err != nil {
		tb.Fatalf("nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats server not ready in 10s")
	}
	tb.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Connect dials s and returns a connection and its JetStream handle, closed
// in cleanup.
func Connect(tb testing.TB, s *server.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, js := Dial(tb, s.ClientURL(), opts...)
	tb.Cleanup(nc.Close)
	return nc, js
}

// Dial connects to url (a comma-separated list for a cluster) and returns
// the connection and its JetStream handle; the caller closes it.
func Dial(tb testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}
