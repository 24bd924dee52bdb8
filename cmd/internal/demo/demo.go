// Package demo builds the example fleet (examples/fleet) on an embedded
// farm, as `builds up --demo` does: it commits the fleet's sources (with a
// static busybox for the base, see package busybox) to a git repository in
// the farm's state directory, announces a change to the base as mesh-git
// would, and shows the plan live until it settles.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/cmd/internal/planview"
	"github.com/meshbuild/meshbuild/internal/busybox"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

// Remote is the repository the example fleet's manifests build from
// (examples/fleet/catalogue); the demo's agents fetch it from Repo.
const Remote = "https://git.example/fleet.git"

// Repo is where Run keeps the fleet's git repository in a farm's state
// directory.
func Repo(stateDir string) string { return filepath.Join(stateDir, "git", "fleet") }

// InsteadOf is the farm.UpOptions.InsteadOf of a farm Run runs on: its
// agents fetch Remote from Repo(stateDir).
func InsteadOf(stateDir string) map[string]string {
	return map[string]string{Remote: Repo(stateDir)}
}

// ErrPlanNotBuilt is wrapped by Run's error when the plan settles without
// every module built.
var ErrPlanNotBuilt = errors.New("the plan was not built")

// Run builds the example fleet on f. It commits the sources in srcDir
// (examples/fleet/src; the base gets a copy of Debian's static
// /bin/busybox) to a git repository under the farm's state directory,
// commits a change to the base, and announces the push as mesh-git does.
// Then it shows the plan live (a progress bar on a terminal, lines
// otherwise) until it settles, and prints it tier by tier with a summary
// per machine. It returns nil when every module was built, and otherwise
// an error wrapping ErrPlanNotBuilt naming the modules that failed.
//
// f must have been started with InsteadOf InsteadOf(f.StateDir()).
func Run(ctx context.Context, f *farm.Farm, srcDir string, out io.Writer) error {
	repo := Repo(f.StateDir())
	if got := f.InsteadOf()[Remote]; filepath.Clean(got) != repo {
		return fmt.Errorf("the farm's agents do not fetch %s from %s: start it with InsteadOf: demo.InsteadOf(%s)", Remote, repo, f.StateDir())
	}
	if fi, err := os.Stat(filepath.Join(srcDir, "base", "Dockerfile")); err != nil || fi.IsDir() {
		return fmt.Errorf("%s has no base/Dockerfile: want the fleet's sources (examples/fleet/src)", srcDir)
	}
	begun := time.Now()

	if err := commitSources(ctx, repo, srcDir); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nThe fleet's sources (%s) are committed to %s,\nwhich the agents fetch for %s.\n", srcDir, repo, Remote)
	commit, paths, err := changeBase(ctx, repo)
	if err != nil {
		return err
	}
	trig := planner.Trigger{Kind: planner.KindPush, Repo: Remote, Ref: "refs/heads/main", Commit: commit, Paths: paths}
	plan := planner.PlanID(trig)

	// The demo announces the push as the operator, whose set includes
	// mesh-git's announcement.
	nc, js, err := daemon.Connect(f.NATSURL(), f.OperatorCreds(), mesh.OperatorPrincipal, "builds up --demo")
	if err != nil {
		return err
	}
	defer nc.Close()
	service, serviceNode, err := assignService(ctx, nc, f)
	if err != nil {
		return err
	}
	if _, _, err := cascade.Push(ctx, js, mesh.Pushed{Repo: trig.Repo, Ref: trig.Ref, Commit: commit, Paths: paths}); err != nil {
		return err
	}
	fmt.Fprintf(out, "Pushed a change to the base: %s (%s) → plan %s\n\n", planner.ShortCommit(commit), strings.Join(paths, ", "), plan)

	store, err := cascade.OpenStore(ctx, js, "build-controller")
	if err != nil {
		return err
	}
	rec, mods, err := follow(ctx, f, store, plan, out)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	planview.PrintPlan(out, rec, mods)
	fmt.Fprintf(out, "\ndemo: %s in %s (push to settled: %s)\n", rec.Outcome,
		time.Since(begun).Round(time.Second), rec.Finished.Sub(rec.Created).Round(100*time.Millisecond))
	if rec.Outcome != cascade.OutcomeBuilt {
		return notBuilt(rec, mods)
	}
	if service != "" {
		return showDeployed(ctx, nc, service, serviceNode, mods[service].Digest, out)
	}
	return nil
}

// notBuilt names a plan's failed modules and why.
func notBuilt(rec cascade.PlanRecord, mods map[string]cascade.ModuleStatus) error {
	var failed []string
	for _, m := range planview.OrderedModules(mods) {
		if m.State == cascade.Failed {
			failed = append(failed, fmt.Sprintf("%s (%s)", m.Module, planview.Failure(m)))
		}
	}
	if len(failed) == 0 {
		return fmt.Errorf("%w: plan %s is %s %s", ErrPlanNotBuilt, rec.ID, rec.Outcome, rec.Message)
	}
	return fmt.Errorf("%w: plan %s %s: %s", ErrPlanNotBuilt, rec.ID, rec.Outcome, strings.Join(failed, "; "))
}

// commitSources makes repo's tree srcDir's, plus the base's busybox, and
// commits it if anything changed.
func commitSources(ctx context.Context, repo, srcDir string) error {
	bin, err := busybox.Static()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(repo, 0o755); err != nil {
		return fmt.Errorf("demo repository: %w", err)
	}
	if _, err := os.Stat(filepath.Join(repo, ".git")); err != nil {
		if _, err := gitIn(ctx, repo, "init", "-q", "-b", "main"); err != nil {
			return err
		}
	}
	// The tree is srcDir's: what was there is removed first.
	entries, err := os.ReadDir(repo)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() != ".git" {
			if err := os.RemoveAll(filepath.Join(repo, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := copyTree(srcDir, repo); err != nil {
		return fmt.Errorf("copying %s: %w", srcDir, err)
	}
	if err := os.WriteFile(filepath.Join(repo, "base", "busybox"), bin, 0o755); err != nil {
		return fmt.Errorf("copying busybox: %w", err)
	}
	if _, err := gitIn(ctx, repo, "add", "-A"); err != nil {
		return err
	}
	// base/.gitignore keeps the binary out of meshbuild's own repository;
	// the fleet's must hold it.
	if _, err := gitIn(ctx, repo, "add", "-f", "base/busybox"); err != nil {
		return err
	}
	status, err := gitIn(ctx, repo, "status", "--porcelain")
	if err != nil || status == "" {
		return err
	}
	_, err = gitIn(ctx, repo, "commit", "-q", "-m", "fleet: the sources in "+srcDir)
	return err
}

// changeBase commits a change to the base's motd and returns the commit and
// the paths it changed.
func changeBase(ctx context.Context, repo string) (string, []string, error) {
	motd := filepath.Join(repo, "base", "motd")
	old, err := os.ReadFile(motd)
	if err != nil {
		return "", nil, fmt.Errorf("the base's motd: %w", err)
	}
	line := fmt.Sprintf("changed by builds up --demo at %s\n", time.Now().UTC().Format(time.RFC3339Nano))
	if err := os.WriteFile(motd, append(old, line...), 0o644); err != nil {
		return "", nil, err
	}
	if _, err := gitIn(ctx, repo, "commit", "-q", "-m", "base: a new motd", "--", "base/motd"); err != nil {
		return "", nil, err
	}
	commit, err := gitIn(ctx, repo, "rev-parse", "HEAD")
	if err != nil {
		return "", nil, err
	}
	changed, err := gitIn(ctx, repo, "diff", "--name-only", "HEAD~1", "HEAD")
	if err != nil {
		return "", nil, err
	}
	return commit, strings.Fields(changed), nil
}

// copyTree copies the files, directories and symbolic links under src into
// dst, keeping file modes.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, data, info.Mode().Perm())
		default:
			return nil
		}
	})
}

// gitIn runs git in dir with a fixed identity and no user or system config,
// and returns its trimmed output.
func gitIn(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{
		"-c", "user.name=meshbuild demo", "-c", "user.email=demo@meshbuild.invalid",
		"-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main",
	}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", cerr
		}
		return "", fmt.Errorf("git %s in %s: %w\n%s", strings.Join(args, " "), dir, err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// planWait is how long the demo waits for the controller to make the
// push's plan.
const planWait = 30 * time.Second

// follow shows a plan's progress until it settles, and returns its record
// and modules: each module that finishes is printed as it does, under a
// progress bar on a terminal and with a progress line every 10s otherwise.
// A farm that fails ends it.
func follow(ctx context.Context, f *farm.Farm, store *cascade.Store, plan string, out io.Writer) (cascade.PlanRecord, map[string]cascade.ModuleStatus, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-f.Failed():
			cancel(fmt.Errorf("the farm failed during the demo: %w", f.Wait()))
		case <-ctx.Done():
		}
	}()
	p := newProgress(out)
	begun := time.Now()
	got, err := planview.Watch(ctx, store, plan, planview.Options{
		Appear: planWait,
		Changed: func(pl planview.Plan, m *cascade.ModuleStatus, was cascade.ModuleState) {
			if m != nil && m.State.Finished() && was != m.State {
				p.line(planview.ModuleLine(*m))
				p.draw(pl, time.Since(begun))
			}
		},
		Ticked: func(pl planview.Plan) { p.draw(pl, time.Since(begun)) },
	})
	p.clear()
	if errors.Is(err, cascade.ErrNoPlan) {
		return got.Record, got.Modules, fmt.Errorf("the controller made no plan %s for the push within %s (see the log)", plan, planWait)
	}
	return got.Record, got.Modules, err
}

// progress draws the live view: lines as modules finish, and on a
// terminal a bar kept on the last line; elsewhere a progress line every
// 10s.
type progress struct {
	out   io.Writer
	tty   bool
	width int
	shown bool      // a bar is on the last line
	last  time.Time // the last progress line (not a terminal)
}

func newProgress(out io.Writer) *progress {
	p := &progress{out: out, width: 80}
	if f, ok := out.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty = true
		if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 40 {
			p.width = w
		}
	}
	p.last = time.Now()
	return p
}

func (p *progress) clear() {
	if p.tty && p.shown {
		fmt.Fprint(p.out, "\r\x1b[K")
		p.shown = false
	}
}

func (p *progress) line(s string) {
	p.clear()
	fmt.Fprintln(p.out, s)
}

func (p *progress) draw(pl planview.Plan, elapsed time.Duration) {
	rec, c := pl.Record, pl.Record.Counts
	status := fmt.Sprintf(" %d/%d built", c.Built, c.Total)
	for _, s := range planview.Tally(c)[1:] { // built is said first
		if s.N > 0 {
			status += fmt.Sprintf(", %d %s", s.N, s.What)
		}
	}
	status += fmt.Sprintf("  %s", clock(elapsed))
	if f, ok := planview.ForecastOf(rec, pl.Modules, time.Now()); ok {
		// Why it waits, when no machine online takes what it needs.
		if s := planview.ShortForecast(f); s != "" {
			status += "; " + s
		}
	}
	if !p.tty {
		if time.Since(p.last) >= 10*time.Second {
			p.last = time.Now()
			fmt.Fprintf(p.out, "  …%s\n", status)
		}
		return
	}
	if r := []rune(status); len(r) > p.width-1 {
		status = string(r[:p.width-2]) + "…"
	}
	barWidth := min(30, p.width-len([]rune(status))-4)
	done := 0
	if c.Total > 0 && barWidth > 0 {
		done = barWidth * c.Finished() / c.Total
	}
	bar := ""
	if barWidth > 0 {
		bar = "[" + strings.Repeat("#", done) + strings.Repeat("-", barWidth-done) + "]"
	}
	fmt.Fprintf(p.out, "\r\x1b[K%s%s", bar, status)
	p.shown = true
}

// clock formats an elapsed time as m:ss.
func clock(d time.Duration) string {
	s := int(d.Seconds())
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}
