package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/mesh"
)

func init() {
	extraCommands = append(extraCommands, priorityCmd)
}

// scheduleFlags are what push and rebuild ask of the controller's
// scheduler (mesh.Schedule).
type scheduleFlags struct {
	priority         int
	owner            string
	cap              int
	cancelSuperseded bool
	set              func(string) bool
}

func (f *scheduleFlags) add(c *cobra.Command, push bool) {
	c.Flags().IntVar(&f.priority, "priority", 0, fmt.Sprintf("the plan's priority, higher first (%d to %d; default: the catalogue's build.priority for the pushed ref, else 0)", mesh.MinPriority, mesh.MaxPriority))
	c.Flags().StringVar(&f.owner, "owner", "", "whom the plan's machine-time counts to for fair share (default: the repository)")
	c.Flags().IntVar(&f.cap, "cap", 0, "the most machines the plan may hold at once (0: no cap)")
	if push {
		c.Flags().BoolVar(&f.cancelSuperseded, "cancel-superseded", false, "cancel the builds in flight of older plans of this repository and ref that this plan supersedes (they finish otherwise)")
	}
	f.set = func(name string) bool { return c.Flags().Changed(name) }
}

// schedule is the mesh.Schedule the flags ask for; nil when none was set.
func (f *scheduleFlags) schedule() (*mesh.Schedule, error) {
	s := &mesh.Schedule{Owner: f.owner, Cap: f.cap, CancelSuperseded: f.cancelSuperseded}
	if f.set("priority") {
		if f.priority < mesh.MinPriority || f.priority > mesh.MaxPriority {
			return nil, fmt.Errorf("--priority %d: want %d to %d", f.priority, mesh.MinPriority, mesh.MaxPriority)
		}
		s.Priority = &f.priority
	}
	if f.cap < 0 {
		return nil, fmt.Errorf("--cap %d: want 1 machine or more, or 0 for none", f.cap)
	}
	if *s == (mesh.Schedule{}) {
		return nil, nil
	}
	return s, nil
}

func priorityCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "priority PLAN N",
		Short: "Change a running plan's priority (higher first): its held asks are ranked by it at once",
		Long: `Change a running plan's priority. The controller hands idle machines to the
highest priority first; asks already handed out finish where they are, and the
plan's held asks are ranked by the new priority from the next idle machine.
With build-controller --window 0 or N nothing is held, and priority changes
nothing.`,
		Args: exactArgs(2),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < mesh.MinPriority || n > mesh.MaxPriority {
				return fmt.Errorf("priority %q: want a whole number from %d to %d", args[1], mesh.MinPriority, mesh.MaxPriority)
			}
			r, err := cascade.Call(ctx, b.nc, controllerModule, cascade.ToolPriority,
				cascade.Request{Plan: args[0], Schedule: &mesh.Schedule{Priority: &n}})
			if err != nil {
				return toolErr(args[0], err)
			}
			if g.json {
				return writeJSON(g.out, r.Record)
			}
			fmt.Fprintf(g.out, "plan %s: priority %d (%s)\n", r.Plan, r.Record.Priority, r.Record.Outcome)
			return nil
		}),
	}
}

// toolErr says a tool's refusal of a plan in the operator's words.
func toolErr(plan string, err error) error {
	if errors.Is(err, cascade.ErrNoPlan) {
		return fmt.Errorf("no plan %s; see `builds plans`", plan)
	}
	return err
}
