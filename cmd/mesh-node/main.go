// Command mesh-node is the node runtime, one per machine: it enrols the
// machine with the mesh-controller seat, reads its declarations from its own
// consumer, pulls each assigned image by digest into a local OCI image layout
// and verifies it, runs --apply-hook for it, and runs the modules it carries
// itself (build-agent) in-process. It reports every outcome and heartbeats to
// the mesh-controller seat.
//
// Every flag has an environment equivalent (MESHBUILD_*), see -h.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

func main() { os.Exit(run()) }

type listFlag []string

func (l *listFlag) String() string     { return fmt.Sprint(*l) }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func hostName() string {
	h, _ := os.Hostname()
	h, _, _ = strings.Cut(strings.ToLower(h), ".")
	return h
}

func run() int {
	cfg := deploy.DefaultNodeConfig()
	fs := flag.NewFlagSet("mesh-node", flag.ContinueOnError)
	natsURL := daemon.NATSFlag(fs)
	creds := fs.String("creds", daemon.Env("MESHBUILD_CREDS", ""), "the node's NATS credentials file: `builds creds issue --principal node --name NAME` (MESHBUILD_CREDS)")
	tls := daemon.TLSFlags(fs)
	fs.StringVar(&cfg.Name, "name", daemon.Env("MESHBUILD_NODE", hostName()), "this node's name: lowercase letters, digits and '-' (MESHBUILD_NODE)")
	fs.StringVar(&cfg.StateDir, "state", daemon.Env("MESHBUILD_NODE_STATE", "/var/lib/meshbuild/node"), "state directory: applied revision, identity, image layout (MESHBUILD_NODE_STATE)")
	platforms := fs.String("platforms", daemon.Env("MESHBUILD_PLATFORMS", mesh.DefaultPlatform), "platforms this node runs and builds, comma separated (MESHBUILD_PLATFORMS)")
	fs.StringVar(&cfg.ApplyHook, "apply-hook", daemon.Env("MESHBUILD_APPLY_HOOK", ""), "program run per module applied or removed, with MESHBUILD_MODULE, _IMAGE, _DIGEST, _REVISION, _ACTION, _LAYOUT set, and MESHBUILD_STATE_SOCKET for a module issued buckets: hand that socket to the module only (MESHBUILD_APPLY_HOOK)")
	insecure := fs.Bool("registry-insecure", daemon.Env("MESHBUILD_REGISTRY_INSECURE", "") == "true", "plain http to the registry (MESHBUILD_REGISTRY_INSECURE=true)")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", cfg.Heartbeat, "how often the node tells the controller it is alive")
	metricsAddr := fs.String("metrics", daemon.Env("MESHBUILD_METRICS", ""), "serve /metrics on this address, e.g. :9466: the node's revision lag and applies, and its build agent's (MESHBUILD_METRICS)")
	// The build agent this node carries when build-agent is assigned to it.
	agentCreds := fs.String("agent-creds", daemon.Env("MESHBUILD_AGENT_CREDS", ""), "NATS credentials of the build agent this node runs, issued for this machine: builds creds issue KEYS --principal agent NAME (default: --creds) (MESHBUILD_AGENT_CREDS)")
	bk := fs.String("buildkit", daemon.Env("MESHBUILD_BUILDKIT_ADDR", "unix:///run/buildkit/buildkitd.sock"), "address of this machine's buildkitd (MESHBUILD_BUILDKIT_ADDR)")
	workspace := fs.String("workspace", daemon.Env("MESHBUILD_WORKSPACE", ""), "the build agent's clones and checkouts (default: STATE/workspace) (MESHBUILD_WORKSPACE)")
	slots := fs.Int("slots", 1, "asks the build agent works at once")
	catalogue := fs.String("catalogue", daemon.Env("MESHBUILD_CATALOGUE", ""), "optional catalogue directory: the build agent refuses asks for modules it does not build (MESHBUILD_CATALOGUE)")
	grace := fs.Duration("grace", 30*time.Second, "when build-agent is unassigned or the node stops, how long builds in hand may finish before their asks are handed back")
	buildTimeout := fs.Duration("build-timeout", agent.DefaultBuildTimeout, "how long one build of the build agent may go on: one still going after it is stopped and failed{build}, once; 0: no bound")
	logLevel := daemon.LogLevelFlag(fs)
	var insteadOf listFlag
	fs.Var(&insteadOf, "git-instead-of", "URL=PATH: the build agent fetches repositories starting with URL from PATH instead (repeatable)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	log, err := logLevel.Logger(os.Stderr)
	if err != nil {
		slog.Error("bad flag", "err", err)
		return 2
	}
	cfg.Registry = registry.NewClient(registry.WithInsecure(*insecure))
	cfg.Platforms = daemon.SplitList(*platforms)
	if err := cfg.Validate(); err != nil {
		log.Error("bad flag", "err", err)
		return 2
	}
	io, err := daemon.ParseInsteadOf(insteadOf)
	if err != nil {
		log.Error("bad flag", "err", err)
		return 2
	}
	if *workspace == "" {
		*workspace = filepath.Join(cfg.StateDir, "workspace")
	}
	if *agentCreds == "" {
		*agentCreds = *creds
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// /metrics: the node's revision lag and applies, and the metrics of
	// the build agent it carries.
	aobs, obs, err := daemon.NodeMetrics(ctx, *metricsAddr, cfg.Name, log)
	if err != nil {
		log.Error("metrics", "err", err)
		return 1
	}
	ac := agentConfig(cfg.Name, cfg.Platforms, *slots)
	ac.Grace, ac.BuildTimeout = *grace, *buildTimeout
	cfg.Carried = map[string]deploy.RunFunc{"build-agent": buildAgent(daemon.AgentOptions{
		NATS: *natsURL, Creds: *agentCreds, TLS: *tls, Agent: ac, MachineSet: true, BuildKit: *bk, RegistryClient: cfg.Registry,
		Workspace: *workspace, InsteadOf: io, Catalogue: *catalogue, Log: log.With("module", "build-agent"), Observer: aobs,
	})}
	topts, err := tls.Options()
	if err != nil {
		log.Error("bad flag", "err", err)
		return 2
	}
	nc, js, err := daemon.Connect(*natsURL, *creds, mesh.PrincipalID(mesh.KindNode, cfg.Name), "mesh-node "+cfg.Name, append(topts, daemon.Logged(log)...)...)
	if err != nil {
		log.Error("connecting", "err", err)
		return 1
	}
	defer nc.Close()
	n, err := deploy.NewNode(cfg, js, log, obs)
	if err != nil {
		log.Error("mesh-node", "err", err)
		return 2
	}
	if err := n.Run(ctx); err != nil {
		log.Error("mesh-node stopped", "err", err)
		return 1
	}
	return 0
}
