// Command build-controller raises the catalogue on NATS (every stream,
// consumer and bucket it implies), turns pushes and operators' requests into
// plans, and walks each plan's build.on graph: a module is asked for the
// moment its last base is built, pinned to the digest just pushed.
//
// One controller works at a time: it claims the mesh-controller seat, and a
// second one started on the same bus stands by (it logs who holds the seat,
// since when) and takes over within the lease when the first stops or dies.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/registry"
)

func main() { os.Exit(run()) }

func run() int {
	cfg := cascade.DefaultConfig()
	fs := flag.NewFlagSet("build-controller", flag.ContinueOnError)
	natsURL := daemon.NATSFlag(fs)
	creds := fs.String("creds", daemon.Env("MESHBUILD_CREDS", ""), "NATS credentials file: `builds creds issue --principal controller` (MESHBUILD_CREDS)")
	tls := daemon.TLSFlags(fs)
	catalogue := fs.String("catalogue", daemon.Env("MESHBUILD_CATALOGUE", ""), "catalogue directory, watched for changes (MESHBUILD_CATALOGUE)")
	fs.StringVar(&cfg.Registry, "registry", daemon.Env("MESHBUILD_REGISTRY", ""), "registry HOST:PORT[/PREFIX] images are pushed to (MESHBUILD_REGISTRY)")
	insecure := fs.Bool("registry-insecure", daemon.Env("MESHBUILD_REGISTRY_INSECURE", "") == "true", "plain http to the registry (MESHBUILD_REGISTRY_INSECURE=true)")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "replicas of every stream and bucket (3 on a cluster)")
	fs.IntVar(&cfg.Window, "window", cfg.Window, daemon.WindowUsage)
	fs.StringVar(&cfg.Sources, "sources", daemon.Env("MESHBUILD_SOURCES", "/var/lib/meshbuild/controller/repos"), "directory of the controller's bare clones: asks carry input keys and inputs built before are not dispatched; empty turns input keys off (MESHBUILD_SOURCES)")
	var insteadOf []string
	fs.Func("git-instead-of", "URL=PATH: fetch repositories starting with URL from PATH instead (repeatable)", func(v string) error {
		insteadOf = append(insteadOf, v)
		return nil
	})
	var shares, caps []string
	fs.Func("share", "OWNER=WEIGHT: the owner's plans share machines in proportion to WEIGHT (default 1 each; repeatable)", func(v string) error {
		shares = append(shares, v)
		return nil
	})
	fs.Func("cap", "OWNER=N: the owner's plans hold at most N machines at once (repeatable)", func(v string) error {
		caps = append(caps, v)
		return nil
	})
	fs.DurationVar(&cfg.ShareHalfLife, "share-half-life", cascade.DefaultShareHalfLife, "how fast an owner's machine-time is forgotten for fair share: it halves every this long")
	fs.BoolVar(&cfg.CancelSuperseded, "cancel-superseded", false, "cancel the builds in flight that a newer plan for the same repository and ref supersedes (they finish otherwise)")
	fs.DurationVar(&cfg.StoreRetryFor, "store-retry-for", cfg.StoreRetryFor, "how long one flush retries plan state the store refuses before it reports the plans and goes on")
	metricsAddr := fs.String("metrics", daemon.Env("MESHBUILD_METRICS", ""), "serve /metrics on this address, e.g. :9465 (MESHBUILD_METRICS)")
	logLevel := daemon.LogLevelFlag(fs)
	lease := fs.Duration("lease", envDuration("MESHBUILD_LEASE", claim.DefaultLease), "how long this controller's claim of mesh-controller outlives it: a standby controller takes over within it (whole seconds; MESHBUILD_LEASE)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	cfg.RegistryClient = registry.NewClient(registry.WithInsecure(*insecure))
	var err error
	if cfg.InsteadOf, err = daemon.ParseInsteadOf(insteadOf); err != nil {
		slog.Error("bad flag", "err", err)
		return 2
	}
	if cfg.Shares, err = daemon.ParseOwnerValues("share", shares, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }); err != nil {
		slog.Error("bad flag", "err", err)
		return 2
	}
	if cfg.Caps, err = daemon.ParseOwnerValues("cap", caps, strconv.Atoi); err != nil {
		slog.Error("bad flag", "err", err)
		return 2
	}
	log, err := logLevel.Logger(os.Stderr)
	if err != nil {
		slog.Error("bad flag", "err", err)
		return 2
	}
	if *catalogue == "" {
		log.Error("no catalogue: set --catalogue DIR")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	topts, err := tls.Options()
	if err != nil {
		log.Error("bad flag", "err", err)
		return 2
	}
	obs, err := daemon.ControllerMetrics(ctx, *metricsAddr, *natsURL, *creds, log, topts...)
	if err != nil {
		log.Error("metrics", "err", err)
		return 1
	}
	err = daemon.RunController(ctx, daemon.ControllerOptions{
		NATS: *natsURL, Creds: *creds, TLS: *tls, Catalogue: *catalogue, Controller: cfg, Observer: obs, Log: log, Lease: *lease,
	})
	if err != nil {
		log.Error("build-controller stopped", "err", err)
		return 1
	}
	return 0
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(daemon.Env(name, "")); err == nil {
		return d
	}
	return def
}
