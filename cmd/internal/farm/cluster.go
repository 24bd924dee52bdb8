package farm

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
)

// ClusterReplicas is the replica count of every stream and bucket on a
// cluster started with UpOptions.Cluster.
const ClusterReplicas = 3

// startNATSCluster starts n JetStream servers on this machine joined by
// routes, for trying a cluster: the first listens for clients on addr (port
// 0: a free one), the others and every route on free ports of addr's host;
// each keeps its store in dir/nK with every write fsynced (sync: always). It
// returns once they have elected a JetStream meta leader, with the client
// URLs, comma-separated, as clients take them.
func startNATSCluster(addr string, n int, dir string, keys *creds.Keys, log *slog.Logger) ([]*server.Server, string, error) {
	host, port, err := splitAddr(addr)
	if err != nil {
		return nil, "", err
	}
	clients, err := freePorts(host, n)
	if err != nil {
		return nil, "", err
	}
	if port != 0 {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, "", &AddrInUseError{What: "NATS", Addr: addr, Flag: "--listen-nats"}
			}
			return nil, "", fmt.Errorf("NATS listening on %s: %w", addr, err)
		}
		ln.Close()
		clients[0] = port
	}
	routes, err := freePorts(host, n)
	if err != nil {
		return nil, "", err
	}
	var rs, us []string
	for i := range n {
		rs = append(rs, "nats://"+net.JoinHostPort(host, strconv.Itoa(routes[i])))
		us = append(us, "nats://"+net.JoinHostPort(host, strconv.Itoa(clients[i])))
	}
	var servers []*server.Server
	stop := func() {
		for _, s := range servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
	for i := range n {
		name := fmt.Sprintf("meshbuild-n%d", i+1)
		store := filepath.Join(dir, fmt.Sprintf("n%d", i+1))
		if err := os.MkdirAll(store, 0o755); err != nil {
			stop()
			return nil, "", fmt.Errorf("NATS store: %w", err)
		}
		// Each server admits only the credentials issued from keys, as
		// the single server does.
		opts, err := keys.ServerOptions()
		if err != nil {
			stop()
			return nil, "", err
		}
		opts.ServerName, opts.Host, opts.Port = name, host, clients[i]
		opts.JetStream, opts.StoreDir, opts.SyncAlways = true, store, true
		opts.Cluster = server.ClusterOpts{Name: "meshbuild", Host: host, Port: routes[i]}
		opts.Routes = server.RoutesFromStr(strings.Join(rs, ","))
		opts.NoSigs = true
		capConnections(opts, openFiles(), n, log.With("server", name))
		queueForFleet(opts)
		s, err := server.NewServer(opts)
		if err != nil {
			stop()
			return nil, "", fmt.Errorf("NATS %s: %w", name, err)
		}
		s.SetLoggerV2(natsLogger{log.With("server", name)}, false, false, false)
		go s.Start()
		servers = append(servers, s)
	}
	for _, s := range servers {
		if !s.ReadyForConnections(30 * time.Second) {
			stop()
			return nil, "", fmt.Errorf("NATS %s did not start on %s within 30s (see the log)", s.Name(), s.ClientURL())
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, s := range servers {
			if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == n {
				return servers, strings.Join(us, ","), nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return nil, "", errors.New("the NATS cluster elected no JetStream meta leader within 60s (see the log)")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePorts finds n distinct free ports on host.
func freePorts(host string, n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("finding a free port on %s: %w", host, err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
