package planview

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

func TestPrintPlan(t *testing.T) {
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := cascade.PlanRecord{
		ID: "p-0123456789ab", Summary: "push https://git.example/fleet.git@1a2b3c4 (refs/heads/main), changed base/motd",
		Outcome: cascade.OutcomeFailed, Counts: cascade.Counts{Built: 2, Failed: 2, Blocked: 1, Total: 5},
		Created: created, Finished: created.Add(75 * time.Second),
	}
	mods := map[string]cascade.ModuleStatus{
		"base":    {Module: "base", Tier: 0, State: cascade.Built, On: "m-a1", Duration: 2100 * time.Millisecond, Digest: "sha256:0123456789abcdef"},
		"runtime": {Module: "runtime", Tier: 1, State: cascade.Built, On: "m-a2", Duration: 3 * time.Second, Digest: "sha256:fedcba9876543210"},
		"tool-01": {Module: "tool-01", Tier: 2, State: cascade.Failed, On: "m-a1", Duration: time.Second,
			Reason: "build", Message: "RUN exit code: 3\nmore", Log: []string{"it broke"}},
		"tool-02": {Module: "tool-02", Tier: 3, State: cascade.Blocked, BlockedBy: "tool-01"},
		// A machine whose only build failed is in the machines summary.
		"tool-03": {Module: "tool-03", Tier: 2, State: cascade.Failed, On: "m-a3", Duration: 2 * time.Second,
			Reason: "build", Message: "RUN exit code: 1"},
	}
	var b bytes.Buffer
	PrintPlan(&b, rec, mods)
	want := `plan p-0123456789ab  failed  push https://git.example/fleet.git@1a2b3c4 (refs/heads/main), changed base/motd
  5 modules: 2 built, 2 failed, 1 blocked in 1m15s
tier 0
  base     built    m-a1  2.1s  0123456789ab
tier 1
  runtime  built    m-a2    3s  fedcba987654
tier 2
  tool-01  failed   m-a1    1s  build: RUN exit code: 3
  tool-03  failed   m-a3    2s  build: RUN exit code: 1
tier 3
  tool-02  blocked  -        -  blocked by tool-01
tool-01 failed (build); its last log lines:
  | it broke
machines
  m-a1  1 built  1 failed  3.1s
  m-a2  1 built            3s
  m-a3  0 built  1 failed  2s
`
	if b.String() != want {
		t.Errorf("PrintPlan:\n%s\nwant:\n%s", b.String(), want)
	}
}

// A module the controller holds for an idle holder (ready) is shown and
// counted as waiting, in every summary alike.
func TestReadyIsWaiting(t *testing.T) {
	rec := cascade.PlanRecord{ID: "p", Outcome: cascade.OutcomeRunning,
		Counts: cascade.Counts{Built: 1, Building: 1, Queued: 1, Ready: 2, Waiting: 1, Total: 6}}
	if got, want := countsLine(rec), "6 modules: 1 built, 1 building, 1 queued, 3 waiting"; got != want {
		t.Errorf("countsLine = %q, want %q", got, want)
	}
	if got := Waiting(rec.Counts); got != 3 {
		t.Errorf("Waiting = %d, want 3 (waiting and ready)", got)
	}
	line := ModuleLine(cascade.ModuleStatus{Module: "tool-01", State: cascade.Ready})
	if !strings.HasPrefix(line, "  waiting ") {
		t.Errorf("ModuleLine of a ready module = %q, want it waiting", line)
	}
	var b bytes.Buffer
	PrintPlan(&b, rec, map[string]cascade.ModuleStatus{"tool-01": {Module: "tool-01", State: cascade.Ready}})
	if !strings.Contains(b.String(), "tool-01  waiting") || strings.Contains(b.String(), "ready") {
		t.Errorf("PrintPlan shows a ready module as:\n%s", b.String())
	}
}

// Without failures the machines summary has no failed column.
func TestMachinesWithoutFailures(t *testing.T) {
	var b bytes.Buffer
	PrintPlan(&b, cascade.PlanRecord{ID: "p", Outcome: cascade.OutcomeBuilt, Counts: cascade.Counts{Built: 1, Total: 1}},
		map[string]cascade.ModuleStatus{"a": {Module: "a", State: cascade.Built, On: "m-a1", Duration: time.Second}})
	if !strings.HasSuffix(b.String(), "machines\n  m-a1  1 built  1s\n") {
		t.Errorf("PrintPlan:\n%s", b.String())
	}
}

// A running plan is shown with the module holding it up, its estimated
// finish and its remaining critical path.
func TestPrintPlanShowsARunningPlansCriticalPath(t *testing.T) {
	now := time.Now()
	rec := cascade.PlanRecord{ID: "p", Outcome: cascade.OutcomeRunning, Counts: cascade.Counts{Built: 1, Building: 1, Waiting: 1, Total: 3}}
	mods := map[string]cascade.ModuleStatus{
		"base":    {Module: "base", State: cascade.Built, Estimate: time.Minute},
		"tool-17": {Module: "tool-17", Tier: 1, Bases: []string{"base"}, State: cascade.Building, On: "host-a1", Estimate: 5 * time.Minute, Started: now.Add(-time.Minute)},
		"cli":     {Module: "cli", Tier: 2, Bases: []string{"tool-17"}, State: cascade.Ready, Estimate: 2 * time.Minute},
	}
	var b bytes.Buffer
	PrintPlan(&b, rec, mods)
	out := b.String()
	for _, want := range []string{
		"  waiting on tool-17 (building on host-a1): 4m",
		" left on the critical path; finish ≈ ",
		"  critical path: tool-17 (building, 4m",
		" → cli (waiting, 2m0s)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("PrintPlan lacks %q:\n%s", want, out)
		}
	}
	f, ok := ForecastOf(rec, mods, now)
	if !ok || !strings.HasPrefix(ShortForecast(f), "ETA ") || !strings.HasSuffix(ShortForecast(f), "left), waiting on tool-17") {
		t.Errorf("short forecast %q", ShortForecast(f))
	}

	// Running past its estimate, the module holding the plan shows no
	// time left of its own, and the finish is a floor.
	late := mods["tool-17"]
	late.Started = now.Add(-7 * time.Minute)
	mods["tool-17"] = late
	f, _ = ForecastOf(rec, mods, now)
	if got := ShortForecast(f); !strings.Contains(got, " or later (at least ") || !strings.HasSuffix(got, "waiting on tool-17, past its 5m0s estimate") {
		t.Errorf("short forecast of an overdue module %q", got)
	}
	b.Reset()
	PrintPlan(&b, rec, mods)
	if out := b.String(); !strings.Contains(out, "critical path: tool-17 (building, past its 5m0s estimate) → cli") || !strings.Contains(out, "past its 5m") {
		t.Errorf("PrintPlan of an overdue module:\n%s", out)
	}
	// An ask no machine online takes: no ETA, and why.
	cli := mods["cli"]
	cli.State, cli.Waiting = cascade.Queued, cascade.NoMachine([]string{"linux/arm64"})
	mods["cli"] = cli
	f, _ = ForecastOf(rec, mods, now)
	if got := ShortForecast(f); got != "no ETA while cli waits: no linux/arm64 machine online" {
		t.Errorf("short forecast of a plan waiting for a platform %q", got)
	}
	// So too at first sight, no build time known.
	first := make(map[string]cascade.ModuleStatus, len(mods))
	for k, m := range mods {
		m.Estimate = 0
		first[k] = m
	}
	f, _ = ForecastOf(rec, first, now)
	if got := ShortForecast(f); !f.Unknown || got != "no ETA while cli waits: no linux/arm64 machine online" {
		t.Errorf("short forecast at first sight of a plan waiting for a platform %q (unknown %v)", got, f.Unknown)
	}
	rec.Outcome = cascade.OutcomeBuilt
	if _, ok := ForecastOf(rec, mods, now); ok {
		t.Error("a settled plan has a forecast")
	}
}

// A module whose ask its holder gave back reads queued, on no machine,
// with why: a retry counts down to its next attempt; a sick machine's
// hand-back waits for a healthy machine, since the budget began. Any other
// state (its next start, its outcome) shows no note.
func TestAHandedBackModuleSaysWhy(t *testing.T) {
	now := time.Date(2026, 12, 1, 14, 2, 51, 0, time.UTC)
	retry := cascade.HandedBack{Attempt: 7, Why: "fetching https://git.example/x.git: connection refused", On: "m9",
		InfraSince: now.Add(-5 * time.Minute), Next: now.Add(40 * time.Second), At: now.Add(-20 * time.Second)}
	if got, want := HandedBackNote(retry, now), "retrying (attempt 7: fetching https://git.example/x.git: connection refused; next in 40s)"; got != want {
		t.Errorf("retry note %q, want %q", got, want)
	}
	if got := HandedBackNote(retry, now.Add(time.Minute)); !strings.HasSuffix(got, "; due now)") {
		t.Errorf("a retry past its time: %q, want due now", got)
	}
	sick := cascade.HandedBack{Attempt: 3, Why: "registry 127.0.0.1:5000 does not answer: connection refused", On: "m9", Sick: true,
		InfraSince: time.Date(2026, 12, 1, 14, 2, 11, 0, time.UTC), At: now}
	if got, want := HandedBackNote(sick, now), "waiting for a healthy machine (given back by m9: registry 127.0.0.1:5000 does not answer: connection refused, since 14:02:11)"; got != want {
		t.Errorf("sick note %q, want %q", got, want)
	}
	if got := HandedBackNote(cascade.HandedBack{Why: strings.Repeat("x", 400)}, now); len(got) > 250 {
		t.Errorf("a long cause is not cut: %d bytes", len(got))
	}
	// As a controller leaves a module given back for a retry: building,
	// on no machine, with the note (cascade's
	// TestAHandedBackIsShownAndForgeriesOfItAreRefused); shown queued.
	var out strings.Builder
	queued := cascade.ModuleStatus{Module: "solo", State: cascade.Building, HandedBack: &retry}
	PrintPlan(&out, cascade.PlanRecord{ID: "p1", Outcome: cascade.OutcomeRunning}, map[string]cascade.ModuleStatus{"solo": queued})
	if line := testenv.GrepLines(out.String(), "solo"); !strings.Contains(line, "queued") || strings.Contains(line, "m9") || !strings.Contains(line, "retrying (attempt 7: ") || !strings.Contains(line, "connection refused; ") {
		t.Errorf("builds show's line for solo: %q, want queued on no machine, retrying (attempt 7: …; next …)\n%s", line, out.String())
	}
	m := cascade.ModuleStatus{Module: "app", State: cascade.Building, HandedBack: &sick}
	if line := ModuleLine(m); !strings.Contains(line, "queued") || strings.Contains(line, "building") || !strings.Contains(line, "waiting for a healthy machine (given back by ") {
		t.Errorf("ModuleLine %q: want queued, waiting for a healthy machine", line)
	}
	m.State, m.Digest = cascade.Built, "sha256:0123456789abcdef"
	if line := ModuleLine(m); strings.Contains(line, "healthy") {
		t.Errorf("a built module with a stale note: %q", line)
	}
}

// A module whose ask its holder gave back is counted as its line shows it:
// queued, not building.
func TestAHandedBackModuleIsCountedQueued(t *testing.T) {
	rec := cascade.PlanRecord{ID: "p", Outcome: cascade.OutcomeRunning,
		Counts: cascade.Counts{Building: 2, Total: 2}}
	hb := &cascade.HandedBack{Attempt: 2, Why: "fetching https://git.example/fleet.git: could not resolve host", On: "m1",
		Next: time.Now().Add(time.Minute)}
	var b bytes.Buffer
	PrintPlan(&b, rec, map[string]cascade.ModuleStatus{
		"a": {Module: "a", State: cascade.Building, On: "m2"},
		"b": {Module: "b", State: cascade.Building, HandedBack: hb},
	})
	if !strings.Contains(b.String(), "2 modules: 1 building, 1 queued") {
		t.Errorf("PrintPlan counts a handed-back module as building:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "  b  queued") {
		t.Errorf("PrintPlan shows the handed-back module as:\n%s", b.String())
	}
}

// A lost holder names its machine and when it started; one not known (it
// went silent before it announced a start) is said so, with who took the
// ask and when.
func TestLostNote(t *testing.T) {
	start := time.Date(2026, 1, 2, 1, 39, 21, 0, time.UTC)
	for _, c := range []struct {
		l    cascade.Lost
		want string
	}{
		{cascade.Lost{On: "vm-x", Started: start, Taken: start.Add(8 * time.Second), TakenBy: "vm-a1"},
			"vm-x went silent building it (started 01:39:21); vm-a1 took the ask at 01:39:29, 8s later"},
		{cascade.Lost{On: "m1", Started: start, Taken: start.Add(2 * time.Second), TakenBy: "m1"},
			"m1 went silent building it (started 01:39:21); its agent, restarted, began it again at 01:39:23, 2s later"},
		{cascade.Lost{Platform: "linux/arm64", Taken: start, TakenBy: "pi"},
			"linux/arm64: a machine went silent with its ask before it announced a start (killed, cut off or stopping; which one is not known); pi took the ask at 01:39:21"},
	} {
		if got := LostNote(c.l); got != c.want {
			t.Errorf("LostNote(%+v)\n got %q\nwant %q", c.l, got, c.want)
		}
	}
}
