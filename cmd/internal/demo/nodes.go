package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/cmd/internal/planview"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/mesh"
)

// DemoService is the example fleet's service module the demo assigns to its
// first build machine, to show a node applying the new digest after the
// base change.
const DemoService = "static-web"

// assignService assigns DemoService to the farm's first machine; a
// catalogue without it assigns nothing.
func assignService(ctx context.Context, nc *nats.Conn, f *farm.Farm) (module, node string, err error) {
	if len(f.Machines()) == 0 {
		return "", "", nil // no node of the farm's own to run it on
	}
	node = f.Machines()[0]
	_, err = deploy.Call(ctx, nc, mesh.AssignTool, deploy.Request{Module: DemoService, Nodes: []string{node}})
	if errors.Is(err, deploy.ErrUnknownModule) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("assigning %s to %s: %w", DemoService, node, err)
	}
	return DemoService, node, nil
}

// showDeployed waits until node has applied module at digest, then prints
// the fleet as `builds nodes` would.
func showDeployed(ctx context.Context, nc *nats.Conn, module, node, digest string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var nodes []deploy.NodeView
	for {
		r, err := deploy.Call(ctx, nc, mesh.NodesTool, deploy.Request{})
		if err != nil {
			return err
		}
		nodes = r.Nodes
		if appliedOn(nodes, module, node, digest) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not apply %s@%s: %w", node, module, digest, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	fmt.Fprintf(out, "\n%s applied %s@%s (`builds nodes`):\n", node, module, digest)
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tONLINE\tREVISION\tMODULES")
	for _, n := range nodes {
		var mods []string
		for _, m := range n.Modules {
			if m.Carried {
				mods = append(mods, m.Module+" (in-process)")
			} else {
				mods = append(mods, m.Module+"@"+m.Applied)
			}
		}
		fmt.Fprintf(tw, "%s\t%v\t%d/%d\t%s\n", n.Node, n.Online, n.Applied, n.Declared, strings.Join(mods, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	r, err := deploy.Call(ctx, nc, mesh.SeatsTool, deploy.Request{})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nwho holds each seat (`builds seats`):\n")
	return planview.PrintSeats(out, r.Seats)
}

func appliedOn(nodes []deploy.NodeView, module, node, digest string) bool {
	for _, n := range nodes {
		if n.Node != node || n.Applied != n.Declared {
			continue
		}
		for _, m := range n.Modules {
			if m.Module == module && m.Applied == digest && m.Declared == digest {
				return true
			}
		}
	}
	return false
}
