package farm

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
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
//
// A port it picked may be taken by another process between the pick and the
// server's listen (a port free a moment ago is handed to the next that
// asks for one, an outgoing connection's too): the cluster is then started
// again on other ports, twice at most.
func startNATSCluster(addr string, n int, dir string, keys *creds.Keys, log *slog.Logger) ([]*server.Server, string, error) {
	for attempt := 1; ; attempt++ {
		servers, urls, err := startNATSClusterOnce(addr, n, dir, keys, log)
		var taken *portsTakenError
		if err == nil || !errors.As(err, &taken) || !taken.picked || attempt == 3 {
			return servers, urls, err
		}
		log.Warn("starting the NATS cluster again on other ports", "err", err)
	}
}

// clusterReadyWait is how long a server of the cluster is given to listen.
var clusterReadyWait = 30 * time.Second

// testHookPortsPicked, when set, is called with the ports each attempt
// picked, before any server listens on them.
var testHookPortsPicked func(host string, clients, routes []int)

// portsTakenError is a server that did not start while ports it was to
// listen on are held by another process.
type portsTakenError struct {
	server string
	ports  []int
	picked bool // every one of them picked by startNATSCluster, none asked for
}

func (e *portsTakenError) Error() string {
	return fmt.Sprintf("NATS %s did not start: port %s taken by another process", e.server, strings.Trim(fmt.Sprint(e.ports), "[]"))
}

// takenPorts are the ports of ports on host that another process listens
// on, or that cannot be listened on.
func takenPorts(host string, ports []int) []int {
	var taken []int
	for _, p := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			taken = append(taken, p)
			continue
		}
		ln.Close()
	}
	return taken
}

func startNATSClusterOnce(addr string, n int, dir string, keys *creds.Keys, log *slog.Logger) ([]*server.Server, string, error) {
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
	if testHookPortsPicked != nil {
		testHookPortsPicked(host, clients, routes)
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
		s.SetLoggerV2(natsLogger{log: log.With("server", name)}, false, false, false)
		go s.Start()
		servers = append(servers, s)
	}
	for i, s := range servers {
		if !s.ReadyForConnections(clusterReadyWait) {
			stop()
			if taken := takenPorts(host, []int{clients[i], routes[i]}); len(taken) > 0 {
				return nil, "", &portsTakenError{server: s.Name(), ports: taken, picked: port == 0 || !slices.Contains(taken, port)}
			}
			return nil, "", fmt.Errorf("NATS %s did not start on %s within %s (see the log)", s.Name(), s.ClientURL(), clusterReadyWait)
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
