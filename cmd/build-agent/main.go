// Command build-agent holds the node-build-agent seat on this machine: it
// pulls one build ask at a time per slot from the shared work queue, builds
// it with the machine's buildkitd, pushes it by digest and announces it.
// One agent holds a machine's seat: a second started with the same --machine
// is refused, naming the first and since when.
//
// Every flag has an environment equivalent (MESHBUILD_*), see -h.
package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/docker/go-units"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/registry"
)

func main() {
	os.Exit(run())
}

type listFlag []string

func (l *listFlag) String() string     { return fmt.Sprint(*l) }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func run() int {
	cfg := agent.DefaultConfig()
	fs := flag.NewFlagSet("build-agent", flag.ContinueOnError)
	natsURL := daemon.NATSFlag(fs)
	creds := fs.String("creds", daemon.Env("MESHBUILD_CREDS", ""), "NATS credentials file of this machine: builds creds issue KEYS --principal agent NAME (MESHBUILD_CREDS)")
	tls := daemon.TLSFlags(fs)
	machine := fs.String("machine", daemon.Env("MESHBUILD_MACHINE", cfg.Machine), "this machine's name in every outcome; default the machine its --creds were issued for, else the host name's first label (MESHBUILD_MACHINE)")
	bk := fs.String("buildkit", daemon.Env("MESHBUILD_BUILDKIT_ADDR", "unix:///run/buildkit/buildkitd.sock"), "address of this machine's buildkitd (MESHBUILD_BUILDKIT_ADDR)")
	reg := fs.String("registry", daemon.Env("MESHBUILD_REGISTRY", ""), "the mesh's registry HOST:PORT: while it does not answer (unreachable, 5xx) this machine is unhealthy and takes no asks; default the registry of the last ask's image (MESHBUILD_REGISTRY)")
	insecure := fs.Bool("registry-insecure", daemon.Env("MESHBUILD_REGISTRY_INSECURE", "") == "true", "plain http to the registry, for a local one (MESHBUILD_REGISTRY_INSECURE=true)")
	workspace := fs.String("workspace", daemon.Env("MESHBUILD_WORKSPACE", "/var/lib/meshbuild/workspace"), "clones and checkouts (MESHBUILD_WORKSPACE)")
	minFree := fs.String("min-free", daemon.Env("MESHBUILD_MIN_FREE", units.BytesSize(agent.DefaultMinFree)), "free space the workspace's file system needs for this machine to take an ask (e.g. 64MiB, 2GiB): below it the machine is sick, takes no asks and says why until space is freed; 0: no check (MESHBUILD_MIN_FREE)")
	platforms := fs.String("platforms", daemon.Env("MESHBUILD_PLATFORMS", ""), "platforms this machine builds, comma separated; default every one its BuildKit worker builds (emulated ones included), and each named must be one of those (MESHBUILD_PLATFORMS)")
	slots := fs.Int("slots", envInt("MESHBUILD_SLOTS", 1), "asks worked at once; each slot pulls one at a time (MESHBUILD_SLOTS)")
	catalogue := fs.String("catalogue", daemon.Env("MESHBUILD_CATALOGUE", ""), "optional catalogue directory: asks for modules it does not build are refused (MESHBUILD_CATALOGUE)")
	metricsAddr := fs.String("metrics", daemon.Env("MESHBUILD_METRICS", ""), "serve /metrics on this address, e.g. :9464 (MESHBUILD_METRICS)")
	fs.BoolVar(&cfg.Overlap, "overlap", daemon.Env("MESHBUILD_OVERLAP", "true") != "false", "a slot pulls its next ask once its build's own steps are done, while the image and its cache are exported and pushed; --overlap=false: once the build has settled (MESHBUILD_OVERLAP=false)")
	fs.DurationVar(&cfg.Grace, "grace", cfg.Grace, "on SIGTERM, how long builds in hand may finish before their asks are handed back")
	fs.DurationVar(&cfg.BuildTimeout, "build-timeout", envDuration("MESHBUILD_BUILD_TIMEOUT", cfg.BuildTimeout), "how long one build may go on: one still going after it (a RUN that never ends) is stopped and failed{build}, once; 0: no bound (MESHBUILD_BUILD_TIMEOUT)")
	fs.DurationVar(&cfg.StartedDelay, "started-delay", envDuration("MESHBUILD_STARTED_DELAY", cfg.StartedDelay), "how long a build goes on before its started is announced: one that ends sooner (a cached rebuild) announces only its outcome, a write and a delivery fewer on the bus; 0: at once (MESHBUILD_STARTED_DELAY)")
	var bkOpts agent.BuildKitOptions
	fs.Int64Var(&bkOpts.SourceDateEpoch, "source-date-epoch", int64(envInt("MESHBUILD_SOURCE_DATE_EPOCH", 0)), "SOURCE_DATE_EPOCH every image is built reproducibly to, seconds since 1970 (MESHBUILD_SOURCE_DATE_EPOCH)")
	fs.StringVar(&bkOpts.Provenance, "provenance", daemon.Env("MESHBUILD_PROVENANCE", agent.ProvenanceMax), "provenance attestation pushed with every image: max, min or off; a module's build.provenance: false turns it off for that module (MESHBUILD_PROVENANCE)")
	fs.StringVar(&bkOpts.SBOMGenerator, "sbom-generator", daemon.Env("MESHBUILD_SBOM_GENERATOR", ""), "SBOM generator image, from the mesh's own registry (e.g. REGISTRY/buildkit-syft-scanner:stable-1); empty: no SBOM, said in each build's log (MESHBUILD_SBOM_GENERATOR)")
	fs.BoolVar(&bkOpts.FollowSyntax, "follow-syntax", daemon.Env("MESHBUILD_FOLLOW_SYNTAX", "") == "true", "build a Dockerfile whose first line is a syntax directive (# syntax=docker/dockerfile:1) with the frontend image it names, which buildkitd must be able to pull; default: buildkitd's own Dockerfile frontend, the directive noted in the build's log (MESHBUILD_FOLLOW_SYNTAX=true)")
	lease := fs.Duration("lease", envDuration("MESHBUILD_LEASE", claim.DefaultLease), "how long this agent's claim of its machine's seat outlives it (whole seconds; MESHBUILD_LEASE)")
	fs.DurationVar(&cfg.FetchWait, "fetch-wait", envDuration("MESHBUILD_FETCH_WAIT", cfg.FetchWait), "how long an idle slot's pull waits before it is renewed; a fleet of more than 500 machines wants 2 × machines × slots ÷ 200 seconds, so that its pulls' expiries and heartbeats cost the server about 200 a second (MESHBUILD_FETCH_WAIT)")
	fs.DurationVar(&cfg.RetryFor, "retry-for", cfg.RetryFor, "how long an ask's infrastructure failures are retried (delays from 2s doubling to 1m) before it is failed{infra}")
	fs.DurationVar(&cfg.ProbeEvery, "probe-every", cfg.ProbeEvery, "how often an idle machine checks that its buildkitd and its registry answer (a sick one stops taking asks and probes with backoff until they do); a building one pings its buildkitd every third of it, and two pings unanswered stop the build and give its ask to another machine; 0: neither")
	fs.DurationVar(&cfg.ClaimLease, "claim-lease", cfg.ClaimLease, "how long an ask's claim outlives its holder's last renewal on the server's clock (renewed every third of it): a killed agent's ask is built elsewhere within about the ack wait (8s), and an agent cut off from the bus for longer loses its ask; 0: three quarters of the ack wait (6s)")
	logLevel := daemon.LogLevelFlag(fs)
	var insteadOf listFlag
	fs.Var(&insteadOf, "git-instead-of", "URL=PATH: fetch repositories starting with URL from PATH instead (repeatable)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	log, err := logLevel.Logger(os.Stderr)
	if err != nil {
		slog.Error("bad flag", "err", err)
		return 2
	}
	machineSet := daemon.Env("MESHBUILD_MACHINE", "") != ""
	fs.Visit(func(f *flag.Flag) { machineSet = machineSet || f.Name == "machine" })
	m, err := daemon.AgentMachine(*creds, *machine, machineSet)
	if err != nil {
		log.Error("bad flag", "err", err)
		return 2
	}
	free, err := units.RAMInBytes(*minFree)
	if err != nil || free < 0 {
		log.Error("bad flag", "flag", "min-free", "value", *minFree, "want", "a size such as 64MiB or 2GiB, or 0 for no check")
		return 2
	}
	if free == 0 {
		free = -1 // AgentOptions: no check
	}
	cfg.Machine, cfg.Slots, cfg.Platforms = m, *slots, daemon.SplitList(*platforms)
	io, err := daemon.ParseInsteadOf(insteadOf)
	if err != nil {
		log.Error("bad flag", "err", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	obs, err := daemon.AgentMetrics(ctx, *metricsAddr, cfg.Machine, log)
	if err != nil {
		log.Error("metrics", "err", err)
		return 1
	}
	err = daemon.RunAgent(ctx, daemon.AgentOptions{
		NATS: *natsURL, Creds: *creds, TLS: *tls, Agent: cfg, BuildKit: *bk, BuildKitOptions: bkOpts, RegistryClient: registry.NewClient(registry.WithInsecure(*insecure)), Registry: *reg,
		Workspace: *workspace, MinFree: free, InsteadOf: io, Catalogue: *catalogue, Observer: obs, Log: log, Lease: *lease, MachineSet: machineSet,
	})
	if err != nil {
		log.Error("build-agent stopped", "err", err)
		return 1
	}
	return 0
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(daemon.Env(name, "")); err == nil {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(daemon.Env(name, "")); err == nil {
		return d
	}
	return def
}
