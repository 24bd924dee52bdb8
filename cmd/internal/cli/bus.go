package cli

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/mesh"
)

// controllerModule is the catalogue module the controller runs as; its
// bucket holds the plans and its tools take requests.
const controllerModule = "build-controller"

// bus is a connection to the farm's NATS.
type bus struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	store *cascade.Store
}

func (g *globals) connect(ctx context.Context) (*bus, error) {
	topts, err := g.tls.Options()
	if err != nil {
		return nil, err
	}
	nc, js, err := daemon.Connect(g.nats, g.creds, mesh.OperatorPrincipal, "builds", topts...)
	if err != nil {
		return nil, err
	}
	st, err := cascade.OpenStore(ctx, js, controllerModule)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("no plans on %s: has build-controller raised its catalogue there? (%w)", g.nats, err)
	}
	return &bus{nc: nc, js: js, store: st}, nil
}

func (b *bus) close() { b.nc.Close() }

// plan reads one plan, with an error that says what to do.
func (b *bus) plan(ctx context.Context, id string) (cascade.PlanRecord, map[string]cascade.ModuleStatus, error) {
	rec, err := b.store.Plan(ctx, id)
	if errors.Is(err, cascade.ErrNoPlan) {
		return rec, nil, fmt.Errorf("no plan %s; see `builds plans`", id)
	}
	if err != nil {
		return rec, nil, err
	}
	mods, err := b.store.Modules(ctx, id)
	return rec, mods, err
}

// isTTY reports whether w is a terminal (colour and progress bars only then).
func isTTY(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// withBus makes a command's RunE from one that works on the farm's bus:
// connected before it runs, closed after.
func (g *globals) withBus(fn func(ctx context.Context, b *bus, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		b, err := g.connect(cmd.Context())
		if err != nil {
			return err
		}
		defer b.close()
		return fn(cmd.Context(), b, args)
	}
}
