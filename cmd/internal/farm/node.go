package farm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/mesh"
)

// runNode runs one build machine of the embedded farm as a node: it enrols,
// and runs the build agent in-process while build-agent is assigned to it.
func runNode(ctx context.Context, natsURL, creds, name, stateDir string, ao daemon.AgentOptions, obs deploy.Observer, log *slog.Logger) error {
	nc, js, err := daemon.Connect(natsURL, creds, mesh.PrincipalID(mesh.KindNode, name), "mesh-node "+name, daemon.Logged(log.With("component", "node", "node", name))...)
	if err != nil {
		return err
	}
	defer nc.Close()
	cfg := deploy.DefaultNodeConfig()
	cfg.Name, cfg.StateDir, cfg.Platforms, cfg.Registry = name, stateDir, ao.Agent.Platforms, ao.RegistryClient
	if len(cfg.Platforms) == 0 {
		// The agent builds what its BuildKit worker builds; the node runs
		// this machine's own platform.
		cfg.Platforms = []string{runtime.GOOS + "/" + runtime.GOARCH}
	}
	cfg.Carried = map[string]deploy.RunFunc{"build-agent": func(actx context.Context) error { return daemon.RunAgent(actx, ao) }}
	n, err := deploy.NewNode(cfg, js, log.With("component", "node", "node", name), obs)
	if err != nil {
		return err
	}
	return n.Run(ctx)
}

// assignBuildAgents waits until every machine has enrolled and assigns
// build-agent to those that do not run it yet.
func assignBuildAgents(ctx context.Context, natsURL, creds string, machines []string) error {
	nc, _, err := daemon.Connect(natsURL, creds, mesh.OperatorPrincipal, "builds up")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		r, err := deploy.Call(ctx, nc, mesh.NodesTool, deploy.Request{})
		if err != nil && !errors.Is(err, deploy.ErrNoController) {
			return err
		}
		enrolled := 0
		for _, n := range r.Nodes {
			if slices.Contains(machines, n.Node) {
				enrolled++
			}
		}
		if err == nil && enrolled == len(machines) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the build machines did not all enrol (%d of %d): %w", enrolled, len(machines), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := deploy.Call(ctx, nc, mesh.AssignTool, deploy.Request{Module: "build-agent", Nodes: machines}); err != nil {
		return fmt.Errorf("assigning build-agent to the build machines: %w", err)
	}
	return nil
}

// nodeHost is this host's name as the first part of a node name: its first
// label, lowercase, with what a node name cannot hold turned into '-'.
func nodeHost() string {
	h, _ := os.Hostname()
	h, _, _ = strings.Cut(strings.ToLower(h), ".")
	h = strings.Trim(strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, h), "-")
	if h == "" || !mesh.ValidName(h) {
		return "machine"
	}
	return h
}
