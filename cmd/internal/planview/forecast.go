package planview

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
)

// ForecastOf is a running plan's forecast at now, computed from its
// modules as they stand (their estimates, the building ones' elapsed
// time), spread over the machines the controller last counted for it. ok
// is false for a plan that is not running.
func ForecastOf(rec cascade.PlanRecord, mods map[string]cascade.ModuleStatus, now time.Time) (cascade.Forecast, bool) {
	if rec.Outcome != cascade.OutcomeRunning || len(mods) == 0 {
		return cascade.Forecast{}, false
	}
	machines := 0
	if rec.Forecast != nil {
		machines = rec.Forecast.Machines
	}
	ordered := OrderedModules(mods)
	for i, m := range ordered {
		if m.HandedBack != nil && m.State == cascade.Building {
			// Given back to the queue: it waits for a machine again,
			// its whole estimate left.
			ordered[i].State, ordered[i].On, ordered[i].Started = cascade.Queued, "", time.Time{}
		}
	}
	return cascade.CriticalPath(ordered, nil, now, machines), true
}

// PrintForecast prints a running plan's forecast: the module holding it
// up, its estimated finish, and its remaining critical path:
//
//	waiting on tool-17 (building on host-a1): 4m12s of 6m0s left on the critical path; finish ≈ 14:03:12 (in 6m0s)
//	critical path: tool-17 (building, 4m12s left) → tool-17-cli (waiting, 1m48s)
func PrintForecast(w io.Writer, f cascade.Forecast) {
	fmt.Fprintf(w, "  %s\n", f.String())
	if len(f.Path) == 0 {
		return
	}
	steps := make([]string, len(f.Path))
	for i, s := range f.Path {
		switch {
		case f.Unknown:
			steps[i] = fmt.Sprintf("%s (%s)", s.Module, shownState(s.State))
		case s.State == cascade.Building && s.Overdue:
			// Its estimate is spent: what is left of it is not known.
			steps[i] = fmt.Sprintf("%s (building, past its %s estimate)", s.Module, duration(s.Estimate))
		case s.State == cascade.Building:
			steps[i] = fmt.Sprintf("%s (building, %s left)", s.Module, duration(s.Left))
		default:
			guess := ""
			if s.Guessed {
				guess = " guessed"
			}
			steps[i] = fmt.Sprintf("%s (%s, %s%s)", s.Module, shownState(s.State), duration(s.Left), guess)
		}
	}
	fmt.Fprintf(w, "  critical path: %s\n", strings.Join(steps, " → "))
}

// ShortForecast is a forecast on a progress line: "ETA 14:03:12 (6m0s
// left), waiting on tool-17"; while tool-17 runs past its estimate, "ETA
// 14:03:12 or later (at least 1m48s left), waiting on tool-17, past its
// 5m0s estimate".
func ShortForecast(f cascade.Forecast) string {
	h, ok := f.Holding()
	if !ok {
		return ""
	}
	if f.Stalled != "" {
		// No machine online takes an ask the plan needs: it ends only
		// once one comes.
		return "no ETA while " + f.Stalled
	}
	if f.Unknown {
		return "waiting on " + h.Module
	}
	if h.Overdue {
		// The module holding the plan has run past its estimate: the
		// rest of the path is a floor, not a forecast.
		return fmt.Sprintf("ETA %s or later (at least %s left), waiting on %s, past its %s estimate",
			f.Finish.Local().Format("15:04:05"), duration(f.Remaining), h.Module, duration(h.Estimate))
	}
	return fmt.Sprintf("ETA %s (%s left), waiting on %s", f.Finish.Local().Format("15:04:05"), duration(f.Remaining), h.Module)
}
