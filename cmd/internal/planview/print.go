package planview

import (
	"cmp"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
)

// PrintPlan prints a plan for an operator: its trigger and outcome, then
// tier by tier each module with its state, the machine that built it (on),
// how long it took and its short digest (or why it failed or is blocked),
// the last log lines of each failed module, and per machine how many
// modules it built and for how long:
//
//	plan p-3f2a9c1d0b7e  built  push https://git.example/fleet.git@1a2b3c4 (refs/heads/main), changed base/motd
//	  39 modules: 39 built in 8.6s
//	tier 0
//	  base        built  host-a1  900ms  eb6349c3a5a8
//	tier 1
//	  runtime     built  host-a3  700ms  ad52143f1d85
//	  static      built  host-a2  600ms  56a90bc3cb90
//	…
//	machines
//	  host-a1  13 built  7.9s
//
// A module whose ask its holder gave back (cascade.HandedBack) is shown
// queued, on no machine, with why: "retrying (attempt 3: …; next in 40s)"
// or "waiting for a healthy machine (given back by vm-x: …, since
// 14:02:11)" (HandedBackNote).
//
// A machine that went silent while it built a module, its ask then
// started by another (cascade.Lost), is said after the modules:
// "app: vm-x went silent building it (started 01:39:21); vm-a1 took the
// ask at 01:39:29, 8s later" (LostNote).
//
// A module held by the controller for an idle holder (cascade.Ready) is
// shown, and counted, as waiting: what it waits for is a holder, and when
// the scheduler gave the machines to other plans, what it waits behind
// (PlanRecord.Held: "waiting: 3 machines busy with plan p-… (priority
// 10)"). A running plan, or one of another priority than 0, has a line for
// its priority, owner and cap.
func PrintPlan(w io.Writer, rec cascade.PlanRecord, mods map[string]cascade.ModuleStatus) {
	fmt.Fprintf(w, "plan %s  %s  %s\n", rec.ID, rec.Outcome, rec.Summary)
	if line := ScheduleLine(rec); line != "" && (rec.Outcome == cascade.OutcomeRunning || rec.Priority != 0) {
		fmt.Fprintf(w, "  %s\n", line)
	}
	fmt.Fprintf(w, "  %s\n", countsLine(shownCounts(rec, mods)))
	if rec.Message != "" {
		fmt.Fprintf(w, "  %s\n", rec.Message)
	}
	if f, ok := ForecastOf(rec, mods, time.Now()); ok {
		PrintForecast(w, f)
	}
	ordered := OrderedModules(mods)
	// One alignment for every tier (a tabwriter would align each tier
	// apart, or pad the tier lines).
	wName, wState, wOn, wDur := 0, 0, 0, 0
	for _, m := range ordered {
		wName, wState = max(wName, len(m.Module)), max(wState, len(stateOf(m)))
		wOn, wDur = max(wOn, len(orDash(m.On))), max(wDur, len(duration(m.Duration)))
	}
	tier := -1
	for _, m := range ordered {
		if m.Tier != tier {
			tier = m.Tier
			fmt.Fprintf(w, "tier %d\n", tier)
		}
		d := detail(m)
		if m.State == cascade.Ready && rec.Held != "" {
			d = "waiting: " + rec.Held
		}
		fmt.Fprintf(w, "  %-*s  %-*s  %-*s  %*s  %s\n", wName, m.Module, wState, stateOf(m), wOn, orDash(m.On), wDur, duration(m.Duration), d)
	}
	for _, m := range ordered {
		if m.State == cascade.Failed && len(m.Log) > 0 {
			fmt.Fprintf(w, "%s failed (%s); its last log lines:\n", m.Module, m.Reason)
			for _, l := range m.Log {
				fmt.Fprintf(w, "  | %s\n", l)
			}
		}
	}
	for _, m := range ordered {
		for _, l := range m.Lost {
			fmt.Fprintf(w, "%s: %s\n", m.Module, LostNote(l))
		}
	}
	sums := machineSums(mods)
	if len(sums) == 0 {
		return
	}
	fmt.Fprintln(w, "machines")
	anyFailed := false
	for _, s := range sums {
		anyFailed = anyFailed || s.failed > 0
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, s := range sums {
		failed := "" // a column only when some machine has failures
		switch {
		case s.failed > 0:
			failed = fmt.Sprintf("%d failed\t", s.failed)
		case anyFailed:
			failed = "\t"
		}
		fmt.Fprintf(tw, "  %s\t%d built\t%s%s\n", s.machine, s.builds, failed, duration(s.total))
	}
	tw.Flush()
}

// shownState is the state an operator reads: a module held for an idle
// holder (ready) is waiting, as the counts say.
func shownState(s cascade.ModuleState) cascade.ModuleState {
	if s == cascade.Ready {
		return cascade.Waiting
	}
	return s
}

// stateOf is the state a module's line shows: its shownState, except that
// a module whose ask its holder gave back is queued (it is back in the
// queue), whatever machine started it before.
func stateOf(m cascade.ModuleStatus) cascade.ModuleState {
	if m.HandedBack != nil && m.State == cascade.Building {
		return cascade.Queued
	}
	return shownState(m.State)
}

// HandedBackNote says why a module's ask is back in the queue, as of now:
// "retrying (attempt 3: git fetch …: connection refused; next in 40s)" for
// a retry after a delay, "waiting for a healthy machine (given back by
// vm-x: registry 127.0.0.1:5000 does not answer: …, since 14:02:11)" for an ask
// a sick machine gave back: back in the queue, for any machine that can
// build (other machines may well be healthy and busy).
func HandedBackNote(h cascade.HandedBack, now time.Time) string {
	why := cutNote(h.Why)
	if h.Sick {
		since := h.InfraSince
		if since.IsZero() {
			since = h.At
		}
		return fmt.Sprintf("waiting for a healthy machine (given back by %s: %s, since %s)", cmp.Or(h.On, "a machine that cannot build"), why, since.UTC().Format(time.TimeOnly))
	}
	next := "due now"
	if d := h.Next.Sub(now); d > 0 {
		next = "next in " + d.Round(time.Second).String()
	}
	return fmt.Sprintf("retrying (attempt %d: %s; %s)", h.Attempt, why, next)
}

// LostNote says that a machine went silent while it built a module and
// another took its ask: "vm-x went silent building it (started 01:39:21);
// vm-a1 took the ask at 01:39:29, 8s later", the platform first for a
// module built for several. A machine not known (it went silent before
// it announced a start) is said so.
func LostNote(l cascade.Lost) string {
	var b strings.Builder
	if l.Platform != "" {
		b.WriteString(l.Platform + ": ")
	}
	if l.On == "" {
		b.WriteString("a machine went silent with its ask before it announced a start (killed, cut off or stopping; which one is not known)")
	} else {
		b.WriteString(l.On + " went silent building it")
	}
	if !l.Started.IsZero() {
		fmt.Fprintf(&b, " (started %s)", l.Started.UTC().Format(time.TimeOnly))
	}
	if l.TakenBy == l.On {
		// The machine's agent went silent and began it again: restarted.
		fmt.Fprintf(&b, "; its agent, restarted, began it again at %s", l.Taken.UTC().Format(time.TimeOnly))
	} else {
		fmt.Fprintf(&b, "; %s took the ask at %s", l.TakenBy, l.Taken.UTC().Format(time.TimeOnly))
	}
	if !l.Started.IsZero() && l.Taken.After(l.Started) {
		fmt.Fprintf(&b, ", %s later", duration(l.Taken.Sub(l.Started)))
	}
	return b.String()
}

// cutNote shortens a cause for a line.
func cutNote(s string) string {
	const most = 160
	if r := []rune(s); len(r) > most {
		return string(r[:most]) + "…"
	}
	return s
}

// Waiting is how many of a plan's modules wait: for a base to be built, or
// (ready) for an idle holder. Every summary counts them so.
func Waiting(c cascade.Counts) int { return c.Waiting + c.Ready }

// Count is a number of modules in one state, for a summary line.
type Count struct {
	N    int
	What string
}

// Tally is a plan's counts in the order summaries give them: built,
// unchanged, superseded, failed, blocked, building, queued, waiting,
// cancelled.
func Tally(c cascade.Counts) []Count {
	return []Count{
		{c.Built, "built"}, {c.Unchanged, "unchanged"}, {c.Superseded, "superseded"}, {c.Failed, "failed"}, {c.Blocked, "blocked"}, {c.Building, "building"},
		{c.Queued, "queued"}, {Waiting(c), "waiting"}, {c.Cancelled, "cancelled"},
	}
}

// shownCounts is rec with its counts as its modules' lines show them: a
// module whose ask its holder gave back is counted queued, as its line says
// (stateOf), not building (by hand: "4 modules: 4 building" above four
// lines "queued … retrying").
func shownCounts(rec cascade.PlanRecord, mods map[string]cascade.ModuleStatus) cascade.PlanRecord {
	for _, m := range mods {
		if m.State == cascade.Building && stateOf(m) == cascade.Queued && rec.Counts.Building > 0 {
			rec.Counts.Building--
			rec.Counts.Queued++
		}
	}
	return rec
}

// countsLine summarises a plan's counts: "39 modules: 39 built in 1m12s".
func countsLine(rec cascade.PlanRecord) string {
	c := rec.Counts
	parts := []string{}
	for _, p := range Tally(c) {
		if p.N > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.N, p.What))
		}
	}
	line := fmt.Sprintf("%d modules", c.Total)
	if len(parts) > 0 {
		line += ": " + strings.Join(parts, ", ")
	}
	if !rec.Finished.IsZero() && !rec.Created.IsZero() {
		if d := rec.Finished.Sub(rec.Created); d < 50*time.Millisecond {
			line += ", settled at once" // nothing was built: every module unchanged, or none
		} else {
			line += " in " + duration(d)
		}
	}
	return line
}

// ModuleLine is one module on one line, as a live view prints it when
// the module finishes: state, name, machine, duration, digest or why not.
func ModuleLine(m cascade.ModuleStatus) string {
	return fmt.Sprintf("  %-9s %-12s %-14s %7s  %s", stateOf(m), m.Module, orDash(m.On), duration(m.Duration), detail(m))
}

// detail is a module's last column: its short digest, or why it has none.
func detail(m cascade.ModuleStatus) string {
	switch {
	case m.BlockedBy != "":
		return "blocked by " + m.BlockedBy
	case m.State == cascade.Failed:
		return Failure(m)
	case m.Waiting != "":
		return "waiting: " + m.Waiting
	case m.HandedBack != nil && (m.State == cascade.Queued || m.State == cascade.Building):
		return HandedBackNote(*m.HandedBack, time.Now())
	case m.State == cascade.Unchanged:
		return ShortDigest(m.Digest) + "  reuses " + m.Reuses
	case m.State == cascade.Superseded:
		return "superseded by " + m.SupersededBy
	default:
		return ShortDigest(m.Digest)
	}
}

// ScheduleLine is a plan's priority, owner and cap on one line:
// "priority 10, owner https://git.example/fleet, cap 4".
func ScheduleLine(rec cascade.PlanRecord) string {
	line := fmt.Sprintf("priority %d", rec.Priority)
	if rec.Owner != "" {
		line += ", owner " + rec.Owner
	}
	if rec.Cap > 0 {
		line += fmt.Sprintf(", cap %d", rec.Cap)
	}
	return line
}

// Failure is why a module failed, on one line: "build: Dockerfile:4: …".
func Failure(m cascade.ModuleStatus) string {
	msg := m.Message
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	if m.Reason == "" || strings.HasPrefix(msg, m.Reason+":") {
		return msg
	}
	return m.Reason + ": " + msg
}

type machineSum struct {
	machine        string
	builds, failed int
	total          time.Duration
}

// machineSums are, per machine, the modules it built and those that failed
// on it, and the time they took.
func machineSums(mods map[string]cascade.ModuleStatus) []machineSum {
	by := map[string]*machineSum{}
	for _, m := range mods {
		if m.On == "" || (m.State != cascade.Built && m.State != cascade.Failed) {
			continue
		}
		s := by[m.On]
		if s == nil {
			s = &machineSum{machine: m.On}
			by[m.On] = s
		}
		if m.State == cascade.Built {
			s.builds++
		} else {
			s.failed++
		}
		s.total += m.Duration
	}
	out := make([]machineSum, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].machine < out[j].machine })
	return out
}

// OrderedModules sorts module statuses by tier, then name.
func OrderedModules(mods map[string]cascade.ModuleStatus) []cascade.ModuleStatus {
	out := make([]cascade.ModuleStatus, 0, len(mods))
	for name, m := range mods {
		if m.Module == "" {
			m.Module = name
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tier != out[j].Tier {
			return out[i].Tier < out[j].Tier
		}
		return out[i].Module < out[j].Module
	})
	return out
}

func duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// ShortDigest is the first 12 hex digits of a sha256 digest, as a plan
// shows it.
func ShortDigest(digest string) string {
	if d, ok := strings.CutPrefix(digest, "sha256:"); ok && len(d) >= 12 {
		return d[:12]
	}
	return orDash(digest)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
