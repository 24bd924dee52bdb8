package farm

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/meshbuild/meshbuild/internal/testenv"
)

// A taken address refuses the start in words that say what to do, before
// anything needs buildkitd.
func TestUpRefusesTakenPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().String()
	catalogue, _ := testenv.SmallFleet(t)

	for _, tc := range []struct {
		name, nats, registry, want string
	}{
		{"nats", taken, "127.0.0.1:0", taken + " is in use: stop what holds it or pass --listen-nats 127.0.0.1:PORT"},
		// NATS on a port of its own, to see it let go of it again.
		{"registry", testenv.FreePorts(t, 1), taken, taken + " is in use: stop what holds it or pass --listen-registry 127.0.0.1:PORT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			f, err := Up(context.Background(), UpOptions{
				Catalogue: catalogue, StateDir: state, ListenNATS: tc.nats, ListenRegistry: tc.registry,
				BuildkitdBin: "/nonexistent/buildkitd",
			})
			if err == nil {
				f.Stop()
				t.Fatal("Up started on a taken port")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Up: %v\nwant it to say %q", err, tc.want)
			}
			if !errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("Up: %v: want errors.Is EADDRINUSE", err)
			}
			var inUse *AddrInUseError
			if !errors.As(err, &inUse) || inUse.Addr != taken {
				t.Errorf("Up: %v: want an *AddrInUseError for %s", err, taken)
			}
			// What started (NATS, for the registry case) was stopped: its
			// port is free again and nothing is left running.
			if tc.nats != taken {
				l, err := net.Listen("tcp", tc.nats)
				if err != nil {
					t.Errorf("NATS's %s is still held after the refusal: %v", tc.nats, err)
				} else {
					l.Close()
				}
			}
			if _, err := os.Stat(state); err != nil {
				t.Errorf("a given state directory was removed: %v", err)
			}
		})
	}
}

// A taken metrics port is refused like the others; so is a buildkitd
// that is not there, saying how to get one. Neither leaves anything
// running.
func TestUpRefusesMetricsPortAndMissingBuildkitd(t *testing.T) {
	catalogue, _ := testenv.SmallFleet(t)
	base := testenv.FreePorts(t, 2)
	_, port, _ := splitAddr(base)
	agentAddr := "127.0.0.1:" + strconv.Itoa(port+1)
	ln, err := net.Listen("tcp", agentAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct {
		name    string
		metrics string
		want    []string
	}{
		{"agent's metrics port taken", base, []string{agentAddr + " is in use: stop what holds it or pass --metrics 127.0.0.1:PORT"}},
		{"no buildkitd", "", []string{"/nonexistent/buildkitd", "make deps", "--buildkit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			natsAddr := testenv.FreePorts(t, 1)
			f, err := Up(context.Background(), UpOptions{
				Catalogue: catalogue, StateDir: t.TempDir(), ListenNATS: natsAddr, ListenRegistry: "127.0.0.1:0",
				MetricsBase: tc.metrics, BuildkitdBin: "/nonexistent/buildkitd",
			})
			if err == nil {
				f.Stop()
				t.Fatal("Up started")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Up: %v\nwant it to say %q", err, w)
				}
			}
			// NATS, started first, was stopped again.
			l, err := net.Listen("tcp", natsAddr)
			if err != nil {
				t.Errorf("NATS's %s is still held: %v", natsAddr, err)
			} else {
				l.Close()
			}
		})
	}
}

func TestUpRefusesBadOptions(t *testing.T) {
	catalogue, _ := testenv.SmallFleet(t)
	for _, tc := range []struct {
		name string
		o    UpOptions
		want string
	}{
		{"no catalogue", UpOptions{}, "--catalogue"},
		{"missing catalogue", UpOptions{Catalogue: "/nonexistent"}, "not a directory"},
		{"negative agents", UpOptions{Catalogue: catalogue, Agents: -1}, "agents -1"},
		{"bad nats address", UpOptions{Catalogue: catalogue, ListenNATS: "4222"}, "--listen-nats"},
		{"metrics on port 0", UpOptions{Catalogue: catalogue, MetricsBase: "127.0.0.1:0"}, "--metrics"},
		{"no agents, each with its own buildkitd", UpOptions{Catalogue: catalogue, Agents: NoAgents, BuildkitdPerAgent: true}, "no agents, and a buildkitd for each agent"},
		{"a cluster of two", UpOptions{Catalogue: catalogue, Cluster: 2}, "--cluster 2: want 3 or more servers"},
		{"negative max parallelism", UpOptions{Catalogue: catalogue, MaxParallelism: -1}, "max parallelism -1"},
		{"a given buildkitd per agent", UpOptions{Catalogue: catalogue, BuildKit: "unix:///run/bk.sock", BuildkitdPerAgent: true},
			"--buildkit unix:///run/bk.sock names the one buildkitd to use"},
		{"max parallelism of a given buildkitd", UpOptions{Catalogue: catalogue, BuildKit: "unix:///run/bk.sock", MaxParallelism: 1},
			"set max-parallelism in its buildkitd.toml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Up(context.Background(), tc.o)
			if !errors.Is(err, ErrUpOptions) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Up: %v, want ErrUpOptions saying %q", err, tc.want)
			}
		})
	}
}

// A farm given no state directory makes one and removes it on Stop.
func TestUpTempState(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, _ := testenv.SmallFleet(t, "base")
	f, err := Up(context.Background(), UpOptions{
		Catalogue: catalogue, ListenNATS: "127.0.0.1:0", ListenRegistry: "127.0.0.1:0",
		BuildkitdBin: testenv.BuildkitdBin(t),
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	dir := f.StateDir()
	if _, err := os.Stat(filepath.Join(dir, "nats")); err != nil {
		t.Errorf("no NATS store in %s: %v", dir, err)
	}
	if err := f.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	// Stop let go of every port: NATS's and the registry's.
	for _, addr := range []string{strings.TrimPrefix(f.NATSURL(), "nats://"), f.RegistryAddr()} {
		if l, err := net.Listen("tcp", addr); err != nil {
			t.Errorf("%s is still held after Stop: %v", addr, err)
		} else {
			l.Close()
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary state directory %s is still there: %v", dir, err)
	}
}
