package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/cascade"
)

func init() { extraCommands = append(extraCommands, whyCmd) }

func whyCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "why PLAN MODULE",
		Short: "Why a module of a plan was built, or not: the inputs that differ from its previous build",
		Long: `Why a module of a plan was built, or not. For a built module, the inputs
of its build that differ from the module's previous build: the build
context's git tree (and the paths that changed in it), the Dockerfile, the
platform, each base's digest old → new; or "forced", or "first build". For
an unchanged module, the plan whose build it reused and why its input key
matched. For a blocked or cancelled one, what stopped it.`,
		Example: `  builds why p-1a2b3c4d5e6f app
  builds why p-1a2b3c4d5e6f app --json`,
		Args: exactArgs(2),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			rec, mods, err := b.plan(ctx, args[0])
			if err != nil {
				return err
			}
			m, ok := mods[args[1]]
			if !ok {
				return fmt.Errorf("plan %s has no module %s; see `builds show %s`", rec.ID, args[1], rec.ID)
			}
			w := cascade.WhyOf(rec.ID, rec.Trigger.Force, m)
			if g.json {
				return writeJSON(g.out, w)
			}
			printWhy(g, w)
			return nil
		}),
	}
}

func printWhy(g *globals, w cascade.Why) {
	fmt.Fprintf(g.out, "%s in plan %s: %s\n", w.Module, w.Plan, w.State)
	fmt.Fprintf(g.out, "  %s\n", w.Summary)
	if len(w.Changes) > 0 {
		tw := tabwriter.NewWriter(g.out, 2, 4, 2, ' ', 0)
		for _, c := range w.Changes {
			fmt.Fprintf(tw, "  %s\t%s\t→ %s\n", c.Input, orDash(c.Old), orDash(c.New))
			for _, p := range c.Paths {
				fmt.Fprintf(tw, "  \t  changed: %s\t\n", p)
			}
		}
		tw.Flush()
	}
	if p := w.Previous; p != nil {
		fmt.Fprintf(g.out, "  previous build: plan %s, %s", p.Plan, p.Digest)
		if p.Commit != "" {
			fmt.Fprintf(g.out, " (commit %.12s)", p.Commit)
		}
		fmt.Fprintln(g.out)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
