package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/cmd/internal/planview"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/mesh"
)

func init() { extraCommands = append(extraCommands, nodesCmd, assignCmd, unassignCmd, seatsCmd) }

func seatsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "seats",
		Short: "Each seat: scope, the modules holding it, the nodes they are assigned to, queue depth",
		Args:  cobra.NoArgs,
		RunE: g.withBus(func(ctx context.Context, b *bus, _ []string) error {
			r, err := deploy.Call(ctx, b.nc, mesh.SeatsTool, deploy.Request{})
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(g.out, nonNil(r.Seats))
			}
			return planview.PrintSeats(g.out, r.Seats)
		}),
	}
}

func nodesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "Each enrolled node: online, platforms, modules and digests, declared vs applied revision, last heartbeat",
		Args:  cobra.NoArgs,
		RunE: g.withBus(func(ctx context.Context, b *bus, _ []string) error {
			r, err := deploy.Call(ctx, b.nc, mesh.NodesTool, deploy.Request{})
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(g.out, nonNil(r.Nodes))
			}
			if len(r.Nodes) == 0 {
				fmt.Fprintln(g.out, "no node has enrolled: run `mesh-node --name NAME` on each machine")
				return nil
			}
			tw := tabwriter.NewWriter(g.out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tONLINE\tPLATFORMS\tREVISION\tOUTCOME\tHEARTBEAT\tMODULES")
			for _, n := range r.Nodes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Node, yesNo(n.Online), strings.Join(n.Platforms, ","),
					revisions(n), dash(n.Outcome), ago(n.Heartbeat), moduleList(n.Modules))
			}
			return tw.Flush()
		}),
	}
}

func assignCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "assign MODULE NODE...",
		Short: "Assign a module to nodes; each node affected is given its new declaration",
		Example: `  builds assign build-agent build-1 build-2
  builds assign static-web web-1`,
		Args: cobra.MinimumNArgs(2),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			return assignment(ctx, g, b, mesh.AssignTool, args)
		}),
	}
}

func unassignCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "unassign MODULE NODE...",
		Short: "Take a module off nodes; a carried build agent hands back what it holds",
		Args:  cobra.MinimumNArgs(2),
		RunE: g.withBus(func(ctx context.Context, b *bus, args []string) error {
			return assignment(ctx, g, b, mesh.UnassignTool, args)
		}),
	}
}

func assignment(ctx context.Context, g *globals, b *bus, tool string, args []string) error {
	r, err := deploy.Call(ctx, b.nc, tool, deploy.Request{Module: args[0], Nodes: args[1:]})
	if err != nil {
		return err
	}
	if g.json {
		return writeJSON(g.out, r)
	}
	nodes := "no node"
	if r.Assignment != nil && len(r.Assignment.Nodes) > 0 {
		nodes = strings.Join(r.Assignment.Nodes, ", ")
	}
	fmt.Fprintf(g.out, "%s is assigned to %s\n", args[0], nodes)
	for _, d := range r.Declared {
		fmt.Fprintf(g.out, "declared %s revision %d (%d modules)\n", d.Node, d.Revision, len(d.Modules))
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func revisions(n deploy.NodeView) string {
	if n.Declared == n.Applied {
		return fmt.Sprintf("%d", n.Applied)
	}
	return fmt.Sprintf("%d (declared %d)", n.Applied, n.Declared)
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func moduleList(ms []deploy.ModuleView) string {
	if len(ms) == 0 {
		return "-"
	}
	var out []string
	for _, m := range ms {
		switch {
		case m.Carried:
			out = append(out, m.Module+" (in-process)")
		case m.Declared == "":
			out = append(out, m.Module+" (not built yet)")
		case m.Applied != m.Declared:
			out = append(out, m.Module+"@"+short(m.Declared)+" (applying; runs "+dash(short(m.Applied))+")")
		default:
			out = append(out, m.Module+"@"+short(m.Declared))
		}
	}
	return strings.Join(out, " ")
}

func short(d string) string {
	_, hex, _ := strings.Cut(d, ":")
	if len(hex) > 12 {
		return hex[:12]
	}
	return hex
}
