package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/cmd/internal/demo"
	"github.com/meshbuild/meshbuild/cmd/internal/farm"
)

func init() { extraCommands = append(extraCommands, upCmd) }

// upFlags are `builds up`'s flags.
type upFlags struct {
	catalogue      string
	agents         int
	state          string
	ephemeral      bool
	stay           bool
	listenNATS     string
	listenRegistry string
	buildkit       string
	metrics        string
	demo           string
	window         int
	cluster        int
	logLevel       string
}

func upCmd(g *globals) *cobra.Command {
	var fl upFlags
	c := &cobra.Command{
		Use:   "up",
		Short: "Run a whole farm on this machine: NATS, a registry, buildkitd, the controller and N agents",
		Long: `Run a whole farm on this machine: an embedded NATS with JetStream, an OCI
registry on disk, buildkitd (started from bin/buildkitd unless --buildkit
names a running one), the controller and --agents build agents sharing it.
The components log to a file in the state directory; the terminal shows
where everything listens. Ctrl-C stops it all.

The state (plans, images, credentials, build cache) is kept in a directory
that the next builds up resumes: --state DIR, else $MESHBUILD_STATE, else
$XDG_STATE_HOME/meshbuild/up, else ~/.local/state/meshbuild/up. --ephemeral
uses a temporary one, removed on exit. One farm at a time uses a state
directory: a second builds up on it is refused, naming the first's pid.

With --demo DIR (examples/fleet) it commits DIR/src to a git repository in
the state directory, pushes a change to the base, shows the plan live and
prints it tier by tier; it exits 0 when every module was built, 1 otherwise
(with --stay it keeps running instead). A farm started again on that state
directory, with or without --demo, fetches the demo's remote from that
repository: the plans it resumes, and changes committed there and pushed
with builds push, build.`,
		Example: `  builds up --catalogue examples/fleet/catalogue --agents 3 --demo examples/fleet
  builds up --catalogue examples/fleet/catalogue --state /var/tmp/farm --metrics 127.0.0.1:9464
  builds up --catalogue examples/fleet/catalogue --ephemeral`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runUp(cmd.Context(), g, fl) },
	}
	f := c.Flags()
	f.StringVar(&fl.catalogue, "catalogue", "", "catalogue directory (default with --demo: DIR/catalogue)")
	f.IntVar(&fl.agents, "agents", 3, "build agents to run; they share one buildkitd (0: none, for build agents started by hand)")
	f.StringVar(&fl.state, "state", "", "state directory, kept and reused, where builds finds the operator's credentials (default $MESHBUILD_STATE, else $XDG_STATE_HOME/meshbuild/up, else ~/.local/state/meshbuild/up)")
	f.BoolVar(&fl.ephemeral, "ephemeral", false, "keep the state in a temporary directory, removed on exit")
	f.BoolVar(&fl.stay, "stay", false, "with --demo: keep the farm running after the demo")
	f.StringVar(&fl.listenNATS, "listen-nats", farm.DefaultListenNATS, "address NATS listens on (port 0: any free port)")
	f.IntVar(&fl.cluster, "cluster", 0, "run N NATS servers joined by routes (a JetStream cluster on this machine, streams and buckets R3; N >= 3) instead of one")
	f.StringVar(&fl.listenRegistry, "listen-registry", farm.DefaultListenRegistry, "address the registry listens on (port 0: any free port)")
	f.StringVar(&fl.buildkit, "buildkit", "", "address of a running buildkitd to use instead of starting bin/buildkitd")
	f.StringVar(&fl.metrics, "metrics", "", "serve /metrics: the controller on this address, agent i on the port i above it (e.g. 127.0.0.1:9464)")
	f.IntVar(&fl.window, "window", cascade.WindowIdle, daemon.WindowUsage)
	f.StringVar(&fl.logLevel, "log-level", daemon.Env("MESHBUILD_LOG_LEVEL", "info"), "debug, info, warn or error: the least severe lines written to the farm's log (debug: the controller's turns, timed) (MESHBUILD_LOG_LEVEL)")
	f.StringVar(&fl.demo, "demo", "", "build the example fleet in DIR (its src/ and catalogue/), then exit with the plan's outcome")
	return c
}

func runUp(ctx context.Context, g *globals, fl upFlags) (err error) {
	src := ""
	if fl.demo != "" {
		src = fl.demo
		if fi, err := os.Stat(filepath.Join(fl.demo, "src")); err == nil && fi.IsDir() {
			src = filepath.Join(fl.demo, "src")
		}
		if fl.catalogue == "" {
			fl.catalogue = filepath.Join(fl.demo, "catalogue")
		}
	}
	if fl.catalogue == "" {
		return errors.New("no catalogue: pass --catalogue DIR (e.g. examples/fleet/catalogue)")
	}
	level, err := daemon.LevelOf(fl.logLevel)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	agents := fl.agents
	switch {
	case agents == 0:
		agents = farm.NoAgents // UpOptions' zero is the default
	case agents < 0:
		return fmt.Errorf("--agents %d: want 0 or more", agents)
	}
	if fl.stay && fl.demo == "" {
		return errors.New("--stay goes with --demo: without it the farm stays anyway")
	}

	if fl.ephemeral && fl.state != "" {
		return errors.New("--ephemeral and --state: choose one (a temporary state directory, or the one named)")
	}
	state, temp := fl.state, fl.ephemeral
	if state == "" && !temp {
		if state, err = farm.DefaultStateDir(); err != nil {
			return err
		}
	}
	if temp {
		if state, err = os.MkdirTemp("", "meshbuild-up-"); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
	} else {
		if state, err = filepath.Abs(state); err != nil {
			return err
		}
		if err := os.MkdirAll(state, 0o755); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
	}
	if temp {
		fmt.Fprintf(g.out, "State: %s (temporary: removed on exit)\n", state)
	} else {
		fmt.Fprintf(g.out, "State: %s (kept: a later builds up resumes it; --ephemeral for a temporary one)\n", state)
	}
	logPath := filepath.Join(state, "builds-up.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	fmt.Fprintf(g.out, "Logs: %s\n", logPath)
	defer func() {
		logFile.Close()
		if !temp {
			return
		}
		if fi, serr := os.Stat(logPath); err != nil && serr == nil && fi.Size() > 0 {
			// Keep the log of a failure: the state goes with the farm.
			kept := state + ".log"
			if os.Rename(logPath, kept) == nil {
				fmt.Fprintf(g.errw, "The log is kept in %s\n", kept)
			}
		}
		os.RemoveAll(state)
	}()

	window := fl.window
	if window == 0 {
		window = farm.WindowEvery // UpOptions' zero is the default
	}
	opts := farm.UpOptions{
		Catalogue: fl.catalogue, Agents: agents, StateDir: state,
		ListenNATS: fl.listenNATS, ListenRegistry: fl.listenRegistry,
		BuildKit: fl.buildkit, MetricsBase: fl.metrics, Window: window, Cluster: fl.cluster,
		Log: slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: level})),
		Out: g.out,
	}
	opts.InsteadOf = upInsteadOf(state, fl.demo != "")
	f, err := farm.Up(ctx, opts)
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("interrupted")
		}
		return err
	}
	defer func() {
		fmt.Fprintln(g.out, "Stopping the farm…")
		if serr := f.Stop(); serr != nil {
			fmt.Fprintf(g.errw, "stopping: %v\n", serr)
		}
	}()

	if fl.demo != "" {
		derr := demo.Run(ctx, f, src, g.out)
		if ctx.Err() != nil {
			return errors.New("interrupted")
		}
		if !fl.stay {
			return derr
		}
		if derr != nil {
			fmt.Fprintf(g.errw, "builds: %v\n", derr)
		}
		fmt.Fprintln(g.out)
		f.PrintWhere(g.out)
	}
	fmt.Fprintln(g.out, "The farm is up; Ctrl-C stops it.")
	werr := make(chan error, 1)
	go func() { werr <- f.Wait() }()
	select {
	case <-ctx.Done():
		return nil
	case err := <-werr:
		return err
	}
}

// upInsteadOf is the agents' repository rewriting of a farm on state: the
// demo's (its remote fetched from the repository it keeps in the state
// directory) with --demo, and also when an earlier --demo left that
// repository there: a farm resumed without --demo still fetches the plans
// it resumes, and the pushes made to it by hand.
func upInsteadOf(state string, withDemo bool) map[string]string {
	if !withDemo {
		if fi, err := os.Stat(filepath.Join(demo.Repo(state), ".git")); err != nil || !fi.IsDir() {
			return nil
		}
	}
	return demo.InsteadOf(state)
}
