package farm

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/term"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/registry"
)

// DemoRemote is the repository the example fleet's manifests build from
// (examples/fleet/catalogue); the demo's agents fetch it from DemoRepo.
const DemoRemote = "https://git.example/fleet.git"

// DemoRepo is where Demo keeps the fleet's git repository in a farm's
// state directory.
func DemoRepo(stateDir string) string { return filepath.Join(stateDir, "git", "fleet") }

// DemoInsteadOf is the UpOptions.InsteadOf of a farm Demo runs on: its
// agents fetch DemoRemote from DemoRepo(stateDir).
func DemoInsteadOf(stateDir string) map[string]string {
	return map[string]string{DemoRemote: DemoRepo(stateDir)}
}

// ErrPlanNotBuilt is wrapped by Demo's error when the plan settles without
// every module built.
var ErrPlanNotBuilt = errors.New("the plan was not built")

// Demo builds the example fleet on f. It commits the sources in srcDir
// (examples/fleet/src; the base gets a copy of Debian's static
// /bin/busybox) to a git repository under the farm's state directory,
// commits a change to the base, and announces the push as mesh-git does.
// Then it shows the plan live (a progress bar on a terminal, lines
// otherwise) until it settles, and prints it tier by tier with a summary
// per machine. It returns nil when every module was built, and otherwise
// an error wrapping ErrPlanNotBuilt naming the modules that failed.
//
// f must have been started with InsteadOf DemoInsteadOf(f.StateDir()).
func Demo(ctx context.Context, f *Farm, srcDir string, out io.Writer) error {
	repo := DemoRepo(f.StateDir())
	if got := f.InsteadOf()[DemoRemote]; filepath.Clean(got) != repo {
		return fmt.Errorf("the farm's agents do not fetch %s from %s: start it with InsteadOf: DemoInsteadOf(%s)", DemoRemote, repo, f.StateDir())
	}
	if fi, err := os.Stat(filepath.Join(srcDir, "base", "Dockerfile")); err != nil || fi.IsDir() {
		return fmt.Errorf("%s has no base/Dockerfile: want the fleet's sources (examples/fleet/src)", srcDir)
	}
	begun := time.Now()

	if err := commitSources(ctx, repo, srcDir); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nThe fleet's sources (%s) are committed to %s,\nwhich the agents fetch for %s.\n", srcDir, repo, DemoRemote)
	commit, paths, err := changeBase(ctx, repo)
	if err != nil {
		return err
	}
	trig := planner.Trigger{Kind: planner.KindPush, Repo: DemoRemote, Ref: "refs/heads/main", Commit: commit, Paths: paths}
	plan := planner.PlanID(trig)

	nc, js, err := Connect(f.NATSURL(), "", "git", "builds up --demo")
	if err != nil {
		return err
	}
	defer nc.Close()
	ev := mesh.Pushed{Version: 1, Repo: trig.Repo, Ref: trig.Ref, Commit: commit, Paths: paths, At: time.Now().UTC()}
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	service, serviceNode, err := assignService(ctx, nc, f)
	if err != nil {
		return err
	}
	subj := mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed)
	if _, err := js.Publish(ctx, subj, data, jetstream.WithMsgID(plan)); err != nil {
		return fmt.Errorf("announcing the push on %s: %w", subj, err)
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
	PrintPlan(out, rec, mods)
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
	for _, m := range orderedModules(mods) {
		if m.State == cascade.Failed {
			failed = append(failed, fmt.Sprintf("%s (%s)", m.Module, failure(m)))
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
	bin, err := staticBusybox()
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

// staticBusybox reads Debian's static busybox, which the base is built on.
func staticBusybox() ([]byte, error) {
	bin, err := os.ReadFile(registry.BusyboxPath)
	if err != nil {
		return nil, fmt.Errorf("the base needs a static busybox: %w (apt-get install -y busybox-static)", err)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return nil, fmt.Errorf("%s is not an ELF binary: %w", registry.BusyboxPath, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("%s is dynamically linked and would not run FROM scratch: apt-get install -y busybox-static", registry.BusyboxPath)
		}
	}
	return bin, nil
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
// and modules. It watches the plan's keys in the store: each module that
// finishes is printed as it does, under a progress bar on a terminal and
// with a progress line every 10s otherwise.
func follow(ctx context.Context, f *Farm, store *cascade.Store, plan string, out io.Writer) (cascade.PlanRecord, map[string]cascade.ModuleStatus, error) {
	w, err := store.KV().WatchFiltered(ctx, []string{cascade.PlanKey(plan), cascade.ModulesOf(plan)})
	if err != nil {
		return cascade.PlanRecord{}, nil, fmt.Errorf("watching plan %s: %w", plan, err)
	}
	defer w.Stop()
	p := newProgress(out)
	var (
		rec     cascade.PlanRecord
		haveRec bool
		mods    = map[string]cascade.ModuleStatus{}
		prefix  = cascade.ModuleKey(plan, "")
		begun   = time.Now()
	)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			p.clear()
			return rec, mods, ctx.Err()
		case <-f.failed:
			p.clear()
			return rec, mods, fmt.Errorf("the farm failed during the demo: %w", f.failErr)
		case <-tick.C:
			if !haveRec && time.Since(begun) > planWait {
				return rec, mods, fmt.Errorf("the controller made no plan %s for the push within %s (see the log)", plan, planWait)
			}
			p.draw(rec, time.Since(begun))
		case e, ok := <-w.Updates():
			if !ok {
				return rec, mods, fmt.Errorf("watching plan %s: the watch stopped", plan)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			if e.Key() == cascade.PlanKey(plan) {
				if err := json.Unmarshal(e.Value(), &rec); err != nil {
					return rec, mods, fmt.Errorf("decoding plan %s: %w", plan, err)
				}
				haveRec = true
			} else if name, ok := strings.CutPrefix(e.Key(), prefix); ok {
				var m cascade.ModuleStatus
				if err := json.Unmarshal(e.Value(), &m); err != nil {
					return rec, mods, fmt.Errorf("decoding %s: %w", e.Key(), err)
				}
				if finished(m.State) && mods[name].State != m.State {
					p.line(finishedLine(m))
					p.draw(rec, time.Since(begun))
				}
				mods[name] = m
			}
			if haveRec && settled(rec) && allFinished(mods, rec.Counts.Total) {
				p.clear()
				return rec, mods, nil
			}
		}
	}
}

// settled reports whether a plan has nothing left in flight.
func settled(r cascade.PlanRecord) bool {
	c := r.Counts
	return r.Outcome != cascade.OutcomeRunning && c.Waiting+c.Ready+c.Queued+c.Building == 0
}

// allFinished reports whether all total modules of a plan are in mods, each
// finished: the module keys of a settled plan may arrive after its record.
func allFinished(mods map[string]cascade.ModuleStatus, total int) bool {
	if len(mods) < total {
		return false
	}
	for _, m := range mods {
		if !finished(m.State) {
			return false
		}
	}
	return true
}

func finished(s cascade.ModuleState) bool {
	return s == cascade.Built || s == cascade.Failed || s == cascade.Blocked || s == cascade.Cancelled
}

// finishedLine is what the live view prints when a module finishes.
func finishedLine(m cascade.ModuleStatus) string {
	return fmt.Sprintf("  %-9s %-12s %-14s %7s  %s", m.State, m.Module, orDash(m.On), duration(m.Duration), detail(m))
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

func (p *progress) draw(rec cascade.PlanRecord, elapsed time.Duration) {
	c := rec.Counts
	status := fmt.Sprintf(" %d/%d built", c.Built, c.Total)
	for _, s := range []struct {
		n    int
		what string
	}{{c.Building, "building"}, {c.Queued + c.Ready, "queued"}, {c.Failed, "failed"}, {c.Blocked, "blocked"}} {
		if s.n > 0 {
			status += fmt.Sprintf(", %d %s", s.n, s.what)
		}
	}
	status += fmt.Sprintf("  %s", clock(elapsed))
	if !p.tty {
		if time.Since(p.last) >= 10*time.Second {
			p.last = time.Now()
			fmt.Fprintf(p.out, "  …%s\n", status)
		}
		return
	}
	barWidth := min(30, p.width-len(status)-4)
	done := 0
	if c.Total > 0 && barWidth > 0 {
		done = barWidth * (c.Built + c.Failed + c.Blocked + c.Cancelled) / c.Total
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
