package cli

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/cmd/internal/planview"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

func init() {
	extraCommands = append(extraCommands, watchCmd, logsCmd, machinesCmd, pushCmd, rebuildCmd, retryCmd, cancelCmd, explainCmd)
}

func watchCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "watch PLAN",
		Short: "Follow a plan until it settles; exit 0 when every module is built, 1 otherwise",
		Args:  exactArgs(1),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			return watchAndShow(ctx, g, b, args[0])
		}),
	}
}

// Watch follows a plan until it settles, drawing a progress bar on a
// terminal and a line per change of its record otherwise; it returns the
// settled plan, its modules with it.
func Watch(ctx context.Context, st *cascade.Store, plan string, w io.Writer, tty bool) (planview.Plan, error) {
	last := ""
	notes := map[string]cascade.HandedBack{} // the last hand-back said of each module
	lost := map[string]cascade.Lost{}        // the last lost holder said of each module
	p, err := planview.Watch(ctx, st, plan, planview.Options{
		Fetching: func(f cascade.Fetching) {
			if f.Commit == "" {
				// The HEAD of a repository the plan's other modules are built from.
				fmt.Fprintf(w, "the controller is fetching the HEAD of %s (since %s): the plan is made when it is there\n", f.Repo, f.Since.Local().Format("15:04:05"))
			} else {
				fmt.Fprintf(w, "the controller is fetching %s at %s (since %s): the plan is made when the commit is there\n", f.Repo, planner.ShortCommit(f.Commit), f.Since.Local().Format("15:04:05"))
			}
		},
		Changed: func(p planview.Plan, m *cascade.ModuleStatus, _ cascade.ModuleState) {
			if m != nil {
				// The record's counts say the rest; a module whose ask
				// went back to the queue says why, once per hand-back.
				var says []string
				if h := m.HandedBack; h != nil && notes[m.Module] != *h {
					notes[m.Module] = *h
					says = append(says, planview.HandedBackNote(*h, time.Now()))
				}
				// A machine gone silent, its ask taken by another, once
				// each (a module keeps the latest few).
				from := 0
				if said, ok := lost[m.Module]; ok {
					from = slices.Index(m.Lost, said) + 1
				}
				for _, l := range m.Lost[from:] {
					says = append(says, planview.LostNote(l))
					lost[m.Module] = l
				}
				for _, say := range says {
					if tty && last != "" {
						fmt.Fprint(w, "\r\x1b[K")
					}
					fmt.Fprintf(w, "%s: %s\n", m.Module, say)
					if tty && last != "" {
						fmt.Fprint(w, last)
					}
				}
				return
			}
			line := progress(p.Record, tty)
			if f, ok := planview.ForecastOf(p.Record, p.Modules, time.Now()); ok {
				if s := planview.ShortForecast(f); s != "" {
					line += "; " + s
				}
			}
			if tty {
				fmt.Fprintf(w, "\r\x1b[K%s", line)
			} else if line != last {
				fmt.Fprintln(w, line)
			}
			last = line
		},
	})
	if tty && last != "" {
		fmt.Fprintln(w)
	}
	if errors.Is(err, cascade.ErrNoPlan) {
		return p, fmt.Errorf("no plan %s; see `builds plans`", plan)
	}
	return p, err
}

// progress renders a plan's counts, as a bar on a terminal.
func progress(r cascade.PlanRecord, bar bool) string {
	c := r.Counts
	done := c.Finished()
	unchanged := ""
	if c.Unchanged > 0 {
		unchanged = fmt.Sprintf(", %d unchanged", c.Unchanged)
	}
	if c.Superseded > 0 {
		unchanged += fmt.Sprintf(", %d superseded", c.Superseded)
	}
	text := fmt.Sprintf("%s %d/%d built%s, %d building, %d queued, %d waiting, %d failed, %d blocked",
		r.ID, c.Built, c.Total, unchanged, c.Building, c.Queued, planview.Waiting(c), c.Failed, c.Blocked)
	if !bar || c.Total == 0 {
		return text
	}
	const width = 30
	n := done * width / c.Total
	return "[" + strings.Repeat("█", n) + strings.Repeat("·", width-n) + "] " + text
}

func logsCmd(g *globals) *cobra.Command {
	var follow bool
	c := &cobra.Command{
		Use:   "logs PLAN MODULE",
		Short: "A module's build output in a plan (log.<ask>), following while it builds",
		Args:  exactArgs(2),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			_, mods, err := b.plan(ctx, args[0])
			if err != nil {
				return err
			}
			m, ok := mods[args[1]]
			if !ok {
				return fmt.Errorf("module %s is not in plan %s; see `builds show %s`", args[1], args[0], args[0])
			}
			if m.Ask == "" {
				return fmt.Errorf("%s has not been asked for yet in plan %s (it is %s)", args[1], args[0], m.State)
			}
			return printLogs(ctx, b.js, m, follow, g, func(ctx context.Context) (cascade.ModuleStatus, error) {
				mods, err := b.store.Modules(ctx, args[0])
				if err := cascade.Readable(err, nil); err != nil { // said once, by plan
					return cascade.ModuleStatus{}, fmt.Errorf("reading plan %s: %w", args[0], err)
				}
				return mods[args[1]], nil
			})
		}),
	}
	c.Flags().BoolVarP(&follow, "follow", "f", true, "keep following until the build's output ends")
	return c
}

// printLogs prints the build output of module m's ask, every attempt of
// it: an ask given back or retried, or taken by another machine when its
// machine went silent, has the output of each attempt, one after the
// other, each after the first under a line naming its machine. Each
// attempt's output ends with a final batch. Following, it stops once the
// module is no longer queued or building (as now reads it, at each final
// batch and when no output came for a while) and the stream holds no more;
// not following, or for a module already finished, when the stream holds
// no more. The machine of a batch is the one its subject
// names (the server lets a machine publish only its own), not the one it
// says.
//
// Any machine may publish on log.<ask> of its own subject, so only the
// output of the machines the plan saw hold the ask (ModuleStatus.Held:
// their started, or for a build shorter than the agent's StartedDelay its
// outcome, carried the ask's proof of delivery) is shown. A batch from
// another machine waits until the plan names it (its started or outcome
// may be applied a moment after its first output); what no holder sent is left
// out, and a line on stderr says how much and from whom.
func printLogs(ctx context.Context, js jetstream.JetStream, m cascade.ModuleStatus, follow bool, g *globals, now func(context.Context) (cascade.ModuleStatus, error)) error {
	// A module built for several platforms is built as one ask per
	// platform, each logged under its own id.
	asks := logAsks(m)
	subjects := make([]string, 0, len(asks))
	for _, id := range slices.Sorted(maps.Keys(asks)) {
		subjects = append(subjects, mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.LogEvent(id)))
	}
	cons, err := js.OrderedConsumer(ctx, mesh.LogsStream, jetstream.OrderedConsumerConfig{FilterSubjects: subjects})
	if err != nil {
		return fmt.Errorf("reading %s: %w", strings.Join(subjects, ", "), err)
	}
	inFlight := func(m cascade.ModuleStatus) bool { return m.State == cascade.Building || m.State == cascade.Queued }
	cur := m
	finished := !inFlight(m)
	var read time.Time        // when cur was read last, after m
	recheck := func() error { // the module now: in flight, and its holders
		c, err := now(ctx)
		if err != nil {
			return err
		}
		cur, finished, read = c, !inFlight(c), time.Now()
		return nil
	}
	// Of each ask: the machine of its last batch printed, and whether
	// that attempt's output ended (a final batch).
	type printed struct {
		from  string
		ended bool
	}
	last := map[string]*printed{}
	lastAsk := "" // the ask of the last batch printed
	// The output of several asks that are over is shown one ask after
	// the other (by platform); followed, as it comes, each change of ask
	// headed by a line.
	grouped := len(asks) > 1 && (!follow || finished) && !g.json
	groups := map[string]*bytes.Buffer{}
	show := func(batch mesh.LogBatch) error {
		p := last[batch.Ask]
		if p == nil {
			p = &printed{}
			last[batch.Ask] = p
		}
		if g.json {
			if err := writeJSON(g.out, batch); err != nil {
				return err
			}
		} else {
			var w io.Writer = g.out
			head := len(asks) > 1 && batch.Ask != lastAsk
			if grouped {
				buf := groups[batch.Ask]
				head = buf == nil
				if head {
					buf = &bytes.Buffer{}
					groups[batch.Ask] = buf
				}
				w = buf
			}
			if head {
				fmt.Fprintf(w, "── %s, on %s ──\n", asks[batch.Ask], batch.On)
			}
			if p.from != "" && (batch.On != p.from || batch.Seq <= 1) {
				fmt.Fprintln(w, attemptLine(p.from, batch.On, p.ended))
			}
			for _, l := range batch.Lines {
				fmt.Fprintln(w, l)
			}
		}
		p.from, p.ended, lastAsk = batch.On, batch.Final, batch.Ask
		return nil
	}
	unheld := &unheldLogs{batches: map[string][]mesh.LogBatch{}, dropped: map[string]int{}}
	// release shows what waited from the machines the plan now names.
	release := func() error {
		for _, b := range unheld.release(cur.HeldBy) {
			if err := show(b); err != nil {
				return err
			}
		}
		return nil
	}
	done := func() error {
		if unheld.size() > 0 {
			if err := recheck(); err != nil {
				return err
			}
			if err := release(); err != nil {
				return err
			}
		}
		// Grouped, each ask's output in the order of its name (the
		// platform).
		for _, id := range slices.SortedFunc(maps.Keys(groups), func(a, b string) int { return cmp.Compare(asks[a], asks[b]) }) {
			if _, err := groups[id].WriteTo(g.out); err != nil {
				return err
			}
		}
		unheld.report(g.errw, m.Ask)
		return nil
	}
	for {
		wait := 2 * time.Second
		if !follow || finished {
			wait = 500 * time.Millisecond
		}
		msg, err := cons.Next(jetstream.FetchMaxWait(wait))
		// Nothing came within the wait (an ordered consumer's Next says
		// nats.ErrTimeout).
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, context.DeadlineExceeded) {
			if !follow || finished {
				return done()
			}
			// Quiet: the module may have finished with no output to end
			// (a cancel, a machine gone for good); then what is left is
			// read and it ends.
			if err := recheck(); err != nil {
				return err
			}
			if err := release(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		var batch mesh.LogBatch
		if err := json.Unmarshal(msg.Data(), &batch); err != nil {
			continue
		}
		_, machine, event, ok := mesh.SplitHolderEventSubject(msg.Subject())
		if !ok {
			continue
		}
		// The machine and the ask are the subject's (the body's are the
		// publisher's word).
		batch.On, batch.Ask = machine, strings.TrimPrefix(event, mesh.LogEvent(""))
		if !cur.HeldBy(machine) && time.Since(read) > 200*time.Millisecond {
			if err := recheck(); err != nil {
				return err
			}
		}
		if !cur.HeldBy(machine) {
			unheld.add(batch)
			continue
		}
		if err := release(); err != nil {
			return err
		}
		if err := show(batch); err != nil {
			return err
		}
		if batch.Final && follow && !finished {
			// The end of an attempt: of the module's last one once it is
			// no longer in flight (a later attempt's output follows).
			if err := recheck(); err != nil {
				return err
			}
		}
	}
}

// logAsks are the asks whose output is module m's, each with what names it
// in the output: the module's one ask, or one per platform.
func logAsks(m cascade.ModuleStatus) map[string]string {
	out := map[string]string{m.Ask: m.Module}
	for _, p := range m.Platforms {
		out[p.Ask] = p.Platform
	}
	return out
}

// unheldLogs are the log batches of machines the plan has not seen start
// the ask, by machine, kept until it does (up to maxUnheldLines lines in
// all; beyond, they are counted only).
type unheldLogs struct {
	batches map[string][]mesh.LogBatch
	lines   int
	dropped map[string]int // batches not kept or never released, by machine
}

const maxUnheldLines = 10000

func (u *unheldLogs) add(b mesh.LogBatch) {
	if u.lines+len(b.Lines) > maxUnheldLines {
		u.dropped[b.On]++
		return
	}
	u.batches[b.On] = append(u.batches[b.On], b)
	u.lines += len(b.Lines)
}

func (u *unheldLogs) size() int { return len(u.batches) }

// release takes out and returns, in order, the batches of the machines
// held reports.
func (u *unheldLogs) release(held func(string) bool) []mesh.LogBatch {
	var out []mesh.LogBatch
	for _, on := range slices.Sorted(maps.Keys(u.batches)) {
		if held(on) {
			for _, b := range u.batches[on] {
				u.lines -= len(b.Lines)
			}
			out = append(out, u.batches[on]...)
			delete(u.batches, on)
		}
	}
	return out
}

// report says on w what was left out: every batch still kept, and those
// dropped.
func (u *unheldLogs) report(w io.Writer, ask string) {
	for on, bs := range u.batches {
		u.dropped[on] += len(bs)
	}
	for _, on := range slices.Sorted(maps.Keys(u.dropped)) {
		fmt.Fprintf(w, "builds: not shown: %d batches of output from %s, which the plan never saw start ask %s\n", u.dropped[on], on, ask)
	}
}

// attemptLine heads the output of an ask's next attempt, on machine on,
// after the output of one on machine from, which ended (a final batch: it
// was given back or retried) or stopped short (its machine went silent).
func attemptLine(from, on string, ended bool) string {
	switch {
	case !ended && on == from:
		return fmt.Sprintf("── %s's output stops here: it went silent; its agent, restarted, began the ask again; its output follows ──", on)
	case !ended:
		return fmt.Sprintf("── %s's output stops here: it went silent, and %s took the ask; its output follows ──", from, on)
	case on == from:
		return fmt.Sprintf("── %s started the ask again; its output follows ──", on)
	}
	return fmt.Sprintf("── %s took the ask %s gave back; its output follows ──", on, from)
}

// Machine is one row of `builds machines`.
type Machine struct {
	Machine string `json:"machine"`
	Online  bool   `json:"online"`
	// Health is agent.HealthHealthy or agent.HealthUnhealthy (the machine
	// takes no asks: Why says what its probe found); empty when offline.
	Health   string    `json:"health,omitempty"`
	Why      string    `json:"why,omitempty"`
	Slots    int       `json:"slots"`
	InFlight int64     `json:"in_flight"`
	Built    int64     `json:"built"`
	Failed   int64     `json:"failed"`
	LastSeen time.Time `json:"last_seen"`
	// Platforms are those whose queues the machine holds: the asks it
	// takes; known while it is online.
	Platforms []string `json:"platforms,omitempty"`
	// Builds are every platform it would take asks for (its BuildKit
	// worker's, or those --platforms or its catalogue narrowed them to);
	// a platform here and not in Platforms has no queue yet, or none the
	// machine may bind.
	Builds []string `json:"builds,omitempty"`
}

func machinesCmd(g *globals) *cobra.Command {
	var wait time.Duration
	c := &cobra.Command{
		Use:   "machines",
		Short: "Each machine seen: slots, in flight, built, failed, last seen",
		Args:  cobra.NoArgs,
		RunE: g.withBus(func(ctx context.Context, b *bus, _ []string) error {
			live, err := agent.AskStatus(ctx, b.nc, wait)
			if err != nil {
				return err
			}
			rows := map[string]*Machine{}
			for _, s := range live {
				rows[s.Machine] = &Machine{Machine: s.Machine, Online: true, Health: s.Health, Why: s.Why, Slots: s.Slots, InFlight: s.InFlight,
					LastSeen: s.At, Platforms: s.Platforms, Builds: s.Builds}
			}
			// What each machine built and failed is counted from the plans
			// the controller keeps, not from the agent's own counters
			// (which start again at zero when it restarts); a machine not
			// answering now is known from them too.
			err = b.store.EachModule(ctx, func(_, _ string, m cascade.ModuleStatus) {
				// A module built for several platforms names each
				// platform's machine.
				for on := range strings.SplitSeq(m.On, ",") {
					if on == "" {
						continue
					}
					row := rows[on]
					if row == nil {
						row = &Machine{Machine: on}
						rows[on] = row
					}
					switch m.State {
					case cascade.Built:
						row.Built++
					case cascade.Failed:
						row.Failed++
					}
					if row.Online {
						continue // it says when it was seen
					}
					seen := m.Finished
					if seen.IsZero() {
						seen = m.Started
					}
					if seen.After(row.LastSeen) {
						row.LastSeen = seen
					}
				}
				// A machine that went silent building a module was seen
				// when it started it.
				for _, l := range m.Lost {
					if l.On == "" {
						continue // not known (it announced no start)
					}
					row := rows[l.On]
					if row == nil {
						row = &Machine{Machine: l.On}
						rows[l.On] = row
					}
					if !row.Online && l.Started.After(row.LastSeen) {
						row.LastSeen = l.Started
					}
				}
			})
			if err := cascade.Readable(err, b.warn); err != nil {
				return fmt.Errorf("reading the plans' modules: %w", err)
			}
			out := make([]Machine, 0, len(rows))
			for _, name := range slices.Sorted(maps.Keys(rows)) {
				out = append(out, *rows[name])
			}
			if g.json {
				return writeJSON(g.out, out)
			}
			if len(out) == 0 {
				fmt.Fprintln(g.errw, "no machine answered and none is in a recent plan; start build-agent on a machine with buildkitd")
				return nil
			}
			tw := tabwriter.NewWriter(g.out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MACHINE\tONLINE\tPLATFORMS\tSLOTS\tIN FLIGHT\tBUILT\tFAILED\tLAST SEEN")
			// An unhealthy machine's cause is said under the table, whole:
			// in its column it would widen every row to its length.
			var sick []Machine
			for _, m := range out {
				online := "no"
				switch {
				case m.Online && m.Health == agent.HealthUnhealthy:
					online = "unhealthy"
					sick = append(sick, m)
				case m.Online:
					online = "yes"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s ago\n", m.Machine, online, cmp.Or(strings.Join(m.Platforms, ","), "-"), m.Slots, m.InFlight, m.Built, m.Failed, age(m.LastSeen))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, m := range sick {
				fmt.Fprintf(g.out, "%s takes no asks until its probe passes: %s\n", m.Machine, cmp.Or(m.Why, "no cause given"))
			}
			return nil
		}),
	}
	c.Flags().DurationVar(&wait, "wait", time.Second, "how long to wait for machines to answer")
	return c
}

func pushCmd(g *globals) *cobra.Command {
	var repo, commit, ref string
	var paths []string
	var watch bool
	var sf scheduleFlags
	c := &cobra.Command{
		Use:   "push --repo URL [--commit C] [--path P]... [--priority N]",
		Short: "Announce a push (as mesh-git does): the controller plans what it changes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if repo == "" {
				return errors.New("--repo is required: the repository URL as the manifests spell it")
			}
			sched, err := sf.schedule()
			if err != nil {
				return err
			}
			if commit == "" {
				c, err := headOf(ctx, repo)
				if err != nil {
					return fmt.Errorf("no --commit and %w", err)
				}
				commit = c
			}
			b, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer b.close()
			// A push of a commit already planned makes no new plan: said
			// so, with the plan's state, rather than shown as new.
			id := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: commit, Ref: ref, Paths: paths})
			before, berr := b.store.Plan(ctx, id)
			id, duplicate, err := cascade.Push(ctx, b.js, mesh.Pushed{Repo: repo, Ref: ref, Commit: commit, Paths: paths, Schedule: sched})
			if err != nil {
				return err
			}
			existed := berr == nil
			if !existed && duplicate {
				// Announced moments ago: the controller may not have
				// made the plan yet.
				before, existed = cascade.PlanRecord{ID: id, Outcome: cascade.OutcomeRunning}, true
			}
			// A push nobody plans yet is queued (EVENTS keeps it): said
			// so, rather than a plan id that watch would not find.
			queued := false
			if !existed && !b.controllerAnswers(ctx) {
				// A controller that holds its seat, and whose tools are
				// there but do not answer in time, is busy (planning a
				// push whose commit it fetches, say): the push is not
				// queued behind a missing controller.
				if holder, held := b.controllerHeld(ctx); held && b.controllerBusy {
					fmt.Fprintf(g.progressOut(), "the controller (%s) has not answered in %s: it is busy, planning a push whose commit it fetches, say; the plan %s comes when it is done\n", holder, controllerWait, id)
				} else {
					queued = true
				}
			}
			if g.json && !watch {
				return writeJSON(g.out, map[string]any{"plan": id, "existed": existed, "queued": queued})
			}
			if existed && !g.json {
				fmt.Fprintln(g.progressOut(), existing(before, "--commit "+planner.ShortCommit(commit)))
			}
			if queued {
				fmt.Fprintln(g.out, notPlannedYet(id, "the push is queued and is planned when build-controller runs"))
				if watch {
					return ErrFailed
				}
				return nil
			}
			if !watch {
				if !existed {
					fmt.Fprintf(g.out, "plan %s (follow it: builds watch %s)\n", id, id)
				}
				return nil
			}
			return watchAndShow(ctx, g, b, id)
		},
	}
	c.Flags().StringVar(&repo, "repo", "", "repository URL, as the manifests' build.repo spells it")
	c.Flags().StringVar(&commit, "commit", "", "the pushed commit (default: the repository's HEAD, via git ls-remote)")
	c.Flags().StringVar(&ref, "ref", "refs/heads/main", "the pushed ref")
	c.Flags().StringSliceVar(&paths, "path", nil, "a changed path (repeatable): a file, or a directory for everything under it; none means anything may have changed")
	c.Flags().BoolVar(&watch, "watch", false, "watch the plan until it settles")
	sf.add(c, true)
	return c
}

// notPlannedYet says that plan id is not made because no controller
// answers, what became of the request (why), and what to do.
func notPlannedYet(id, why string) string {
	return fmt.Sprintf("plan %s is not made yet: no controller answered, so %s; start build-controller, then follow it: builds watch %s", id, why, id)
}

// controllerAnswers reports whether a controller answers its tools now
// (any reply, even a refusal, is an answer).
// held is controllerHeld's second result.
func held(_ string, ok bool) bool { return ok }

// controllerWait is how long a controller is given to answer
// (controllerAnswers).
const controllerWait = 3 * time.Second

func (b *bus) controllerAnswers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, controllerWait)
	defer cancel()
	_, err := cascade.Call(ctx, b.nc, controllerModule, cascade.ToolRetry, cascade.Request{Plan: "-"})
	var te *cascade.ToolError
	// Asked and not answered in time: a controller is subscribed, busy.
	b.controllerBusy = errors.Is(err, context.DeadlineExceeded)
	return err == nil || errors.As(err, &te)
}

// controllerHeld reports whether a controller holds the mesh-controller
// seat (and who): one that does not answer is then busy, not gone. false
// when the claim cannot be read.
func (b *bus) controllerHeld(ctx context.Context) (string, bool) {
	rec, ok, err := claim.Current(ctx, b.js, mesh.ControllerSeat, claim.Mesh())
	if err != nil || !ok {
		return "", false
	}
	return rec.Holder, true
}

func watchAndShow(ctx context.Context, g *globals, b *bus, id string) error {
	if _, err := b.store.Plan(ctx, id); errors.Is(err, cascade.ErrNoPlan) && !b.controllerAnswers(ctx) && !(b.controllerBusy && held(b.controllerHeld(ctx))) {
		// A push announced while no controller runs is planned when one
		// starts: not "no plan".
		return errors.New(notPlannedYet(id, "a push or rebuild announced meanwhile waits, queued, until one runs"))
	}
	p, err := Watch(ctx, b.store, id, g.progressOut(), isTTY(g.progressOut()))
	if err != nil {
		return err
	}
	rec := p.Record
	err = showPlan(g, rec, p.Modules)
	if err == nil && rec.Outcome != cascade.OutcomeBuilt {
		return ErrFailed
	}
	if err == nil && rec.Counts.Total > 0 && rec.Counts.Unchanged == rec.Counts.Total {
		fmt.Fprintf(g.errw, "nothing was built: every module's inputs were built before (each reuses that digest); to build them again: builds rebuild --force MODULE...\n")
	}
	return err
}

// existing says that a request made no new plan because its plan exists,
// what became of that plan, and what to run next. what names the request
// ("--commit 1a2b3c4", "--id X").
func existing(r cascade.PlanRecord, what string) string {
	switch r.Outcome {
	case cascade.OutcomeRunning:
		return fmt.Sprintf("plan %s for %s already exists and is running: no new plan; follow it: builds watch %s", r.ID, what, r.ID)
	case cascade.OutcomeCancelled:
		return fmt.Sprintf("plan %s for %s already exists and was cancelled: no new plan is made for it; build again with a new request: builds rebuild MODULE...", r.ID, what)
	default:
		return fmt.Sprintf("plan %s for %s already exists (%s): no new plan; see it: builds show %s", r.ID, what, r.Outcome, r.ID)
	}
}

func headOf(ctx context.Context, repo string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", "ls-remote", repo, "HEAD").Output()
	if err != nil {
		return "", fmt.Errorf("git ls-remote %s HEAD failed: pass --commit", repo)
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return "", fmt.Errorf("%s has no HEAD: pass --commit", repo)
	}
	return f[0], nil
}

func rebuildCmd(g *globals) *cobra.Command {
	var id string
	var watch, force bool
	var sf scheduleFlags
	c := &cobra.Command{
		Use:   "rebuild MODULE...",
		Short: "Rebuild modules and everything built on them",
		Args:  minimumArgs(1),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			if id == "" {
				id = newID()
			}
			sched, err := sf.schedule()
			if err != nil {
				return err
			}
			r, err := cascade.Call(ctx, b.nc, controllerModule, cascade.ToolRebuild, cascade.Request{ID: id, Modules: args, Force: force, Schedule: sched})
			switch {
			case errors.Is(err, cascade.ErrUnknownModule):
				// The controller's message names the module and the
				// command that lists the catalogue's.
				return refused(r, err, "")
			case err != nil:
				return err
			}
			if !r.Created && !g.json {
				fmt.Fprintln(g.progressOut(), existing(r.Record, "--id "+id))
			}
			if watch {
				return watchAndShow(ctx, g, b, r.Plan)
			}
			if g.json {
				return writeJSON(g.out, r.Record)
			}
			if r.Created {
				fmt.Fprintf(g.out, "plan %s: %d modules (follow it: builds watch %s)\n", r.Plan, r.Record.Counts.Total, r.Plan)
			}
			return nil
		}),
	}
	c.Flags().StringVar(&id, "id", "", "request id: the same id twice is one plan (default: a new one)")
	c.Flags().BoolVar(&watch, "watch", false, "watch the plan until it settles")
	c.Flags().BoolVar(&force, "force", false, "build every module, even those whose inputs were built before (otherwise settled unchanged)")
	sf.add(c, false)
	return c
}

func retryCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "retry PLAN MODULE",
		Short: "Re-submit a failed module; on success what it blocked is released",
		Args:  exactArgs(2),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			return tool(ctx, g, b, cascade.ToolRetry, cascade.Request{Plan: args[0], Module: args[1]})
		}),
	}
}

func cancelCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel PLAN",
		Short: "Stop a plan: queued asks are dropped, builds in flight are cancelled",
		Args:  exactArgs(1),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			return tool(ctx, g, b, cascade.ToolCancel, cascade.Request{Plan: args[0]})
		}),
	}
}

func tool(ctx context.Context, g *globals, b *bus, name string, req cascade.Request) error {
	r, err := cascade.Call(ctx, b.nc, controllerModule, name, req)
	switch {
	case errors.Is(err, cascade.ErrNoPlan):
		return fmt.Errorf("no plan %s; see `builds plans`", req.Plan)
	case errors.Is(err, cascade.ErrNotFailed):
		// Said from the plan as stored when it can be read.
		if _, mods, perr := b.plan(ctx, req.Plan); perr == nil {
			if m, ok := mods[req.Module]; ok {
				return &refusal{err: err, msg: fmt.Sprintf("%s has not failed in plan %s: it is %s, and only a failed module is retried; see `builds show %s`",
					req.Module, req.Plan, m.State, req.Plan)}
			}
		}
		return refused(r, err, "see `builds show "+req.Plan+"`")
	case errors.Is(err, cascade.ErrUnknownModule):
		return &refusal{err: err, msg: fmt.Sprintf("%s is not a module of plan %s; see `builds show %s` for its modules", req.Module, req.Plan, req.Plan)}
	case errors.Is(err, cascade.ErrPlanCancelled):
		return &refusal{err: err, msg: fmt.Sprintf("plan %s was cancelled, and a cancelled plan does not go on: %s is not retried in it; build it again in a new plan: builds rebuild %s", req.Plan, req.Module, req.Module)}
	case err != nil:
		return err
	}
	if g.json {
		return writeJSON(g.out, r)
	}
	switch {
	case name == cascade.ToolCancel && r.Record.Outcome != cascade.OutcomeCancelled:
		// Settled before the cancel came: nothing was left to stop.
		fmt.Fprintf(g.out, "plan %s: %s: it had settled, nothing was left to cancel\n", r.Plan, r.Record.Outcome)
	case len(r.Asks) == 0:
		fmt.Fprintf(g.out, "plan %s: %s\n", r.Plan, r.Record.Outcome)
	default:
		fmt.Fprintf(g.out, "plan %s: %s (asks %s)\n", r.Plan, r.Record.Outcome, strings.Join(r.Asks, ", "))
	}
	return nil
}

func explainCmd(g *globals) *cobra.Command {
	var dir, repo, commit string
	var paths, modules []string
	c := &cobra.Command{
		Use:   "explain --catalogue DIR (--repo URL [--path P]... | --module M...)",
		Short: "What a push or a rebuild would build, tier by tier, and why — offline, submitting nothing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("--catalogue DIR is required")
			}
			var t planner.Trigger
			switch {
			case repo != "" && len(modules) == 0:
				if commit == "" {
					commit = "HEAD"
				}
				t = planner.Trigger{Kind: planner.KindPush, Repo: repo, Commit: commit, Paths: paths}
			case repo == "" && len(modules) > 0:
				t = planner.Trigger{Kind: planner.KindRebuild, Modules: modules, ID: "explain"}
			default:
				return errors.New("give either --repo URL (with --path P…) or --module M…, not both")
			}
			cat, err := loadCatalogue(g, dir)
			if err != nil {
				return err
			}
			p, err := planner.New(cat, t)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(g.out, p)
			}
			return p.Explain(g.out)
		},
	}
	c.Flags().StringVar(&dir, "catalogue", os.Getenv("MESHBUILD_CATALOGUE"), "catalogue directory (env MESHBUILD_CATALOGUE)")
	c.Flags().StringVar(&repo, "repo", "", "a pushed repository")
	c.Flags().StringVar(&commit, "commit", "", "the pushed commit (for display)")
	c.Flags().StringSliceVar(&paths, "path", nil, "a changed path (repeatable): a file, or a directory for everything under it")
	c.Flags().StringSliceVar(&modules, "module", nil, "a module to rebuild (repeatable)")
	return c
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return time.Now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b)
}

// progressOut is where progress goes: stdout, or stderr when stdout is JSON.
func (g *globals) progressOut() io.Writer {
	if g.json {
		return g.errw
	}
	return g.out
}
