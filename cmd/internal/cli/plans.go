package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/planview"
)

func init() {
	extraCommands = append(extraCommands, plansCmd, showCmd)
}

func plansCmd(g *globals) *cobra.Command {
	var limit int
	c := &cobra.Command{
		Use:   "plans",
		Short: "Recent plans: id, trigger, state, counts, age",
		Args:  cobra.NoArgs,
		RunE: g.withBus(func(ctx context.Context, b *bus, _ []string) error {
			recs, err := b.store.Plans(ctx)
			if err := cascade.Readable(err, g.warnUnreadable); err != nil {
				return err
			}
			if limit > 0 && len(recs) > limit {
				recs = recs[:limit]
			}
			if g.json {
				return writeJSON(g.out, nonNil(recs))
			}
			if len(recs) == 0 {
				fmt.Fprintln(g.errw, "no plans yet; start one with `builds push` or `builds rebuild MODULE`")
				return nil
			}
			tw := tabwriter.NewWriter(g.out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PLAN\tSTATE\tPRIORITY\tBUILT\tUNCHANGED\tSUPERSEDED\tFAILED\tBLOCKED\tBUILDING\tQUEUED\tWAITING\tTOTAL\tAGE\tTRIGGER")
			for _, r := range recs {
				c := r.Counts
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", r.ID, paint(g, string(r.Outcome)), r.Priority,
					c.Built, c.Unchanged, c.Superseded, c.Failed, c.Blocked, c.Building, c.Queued, planview.Waiting(c), c.Total, age(r.Created), r.Summary)
			}
			return tw.Flush()
		}),
	}
	c.Flags().IntVar(&limit, "limit", 20, "at most this many plans, newest first (0: all)")
	return c
}

func showCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show PLAN",
		Short: "A plan tier by tier: module, state, machine, duration, digest, reason",
		Args:  exactArgs(1),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			rec, mods, err := b.plan(ctx, args[0])
			if err != nil {
				return err
			}
			return showPlan(g, rec, mods)
		}),
	}
}

// PlanView is `builds show --json`.
type PlanView struct {
	Plan     cascade.PlanRecord     `json:"plan"`
	Modules  []cascade.ModuleStatus `json:"modules"`
	Machines []string               `json:"machines"`
	// Forecast is a running plan's remaining critical path and estimated
	// finish, computed now from its modules (planview.ForecastOf).
	Forecast *cascade.Forecast `json:"forecast,omitempty"`
}

func machinesOf(mods map[string]cascade.ModuleStatus) []string {
	seen := map[string]bool{}
	for _, m := range mods {
		// A module built for several platforms names each one's machine.
		for on := range strings.SplitSeq(m.On, ",") {
			if on != "" {
				seen[on] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

func paint(g *globals, s string) string { return colorize(isTTY(g.out), s) }

// colorize colours a state on a terminal, padded so that columns stay
// aligned (tabwriter counts the escape codes).
func colorize(on bool, s string) string {
	if !on {
		return s
	}
	padded := fmt.Sprintf("%-9s", s)
	code := ""
	switch s {
	case "built":
		code = "32"
	case "failed":
		code = "31"
	case "blocked", "cancelled":
		code = "33"
	case "building", "running":
		code = "36"
	default:
		return padded
	}
	return "\x1b[" + code + "m" + padded + "\x1b[0m"
}

// showPlan prints a plan: tier by tier, or as a PlanView in JSON.
func showPlan(g *globals, rec cascade.PlanRecord, mods map[string]cascade.ModuleStatus) error {
	if g.json {
		v := PlanView{Plan: rec, Modules: planview.OrderedModules(mods), Machines: machinesOf(mods)}
		for i, m := range v.Modules {
			if w := cascade.WhyOf(rec.ID, rec.Trigger.Force, m); m.State != cascade.Waiting && m.State != cascade.Ready {
				v.Modules[i].Why = &w
			}
		}
		if f, ok := planview.ForecastOf(rec, mods, time.Now()); ok {
			v.Forecast = &f
		}
		return writeJSON(g.out, v)
	}
	planview.PrintPlan(g.out, rec, mods)
	if len(mods) > 0 {
		fmt.Fprintf(g.out, "why a module was built (or not): builds why %s MODULE\n", rec.ID)
	}
	return nil
}
