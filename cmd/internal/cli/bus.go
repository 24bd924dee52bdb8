package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/creds"
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
	// controllerBusy says that the last controllerAnswers timed out: a
	// controller's tools are there, and did not answer in time.
	controllerBusy bool
	// warn says what of the store cannot be read (the rest is shown).
	warn func(*cascade.UnreadableError)
}

func (g *globals) connect(ctx context.Context) (*bus, error) {
	nc, js, err := g.dial()
	if err != nil {
		return nil, err
	}
	st, err := cascade.OpenStore(ctx, js, controllerModule)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("no plans on %s: has build-controller raised its catalogue there? (%w)", g.nats, err)
	}
	return &bus{nc: nc, js: js, store: st, warn: g.warnUnreadable}, nil
}

// warnUnreadable tells the operator of stored records that cannot be read,
// on stderr: what can be read is shown all the same.
func (g *globals) warnUnreadable(e *cascade.UnreadableError) {
	fmt.Fprintf(g.errw, "warning: %v\n", e)
}

func (b *bus) close() { b.nc.Close() }

// dial connects to the farm's NATS as the operator, with --tls-* and opts.
// Credentials issued to another of the mesh's principals are refused
// first, by name: under them every request would be refused, or time out
// on an inbox the operator's prefix does not reach.
func (g *globals) dial(opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	if err := operatorCreds(g.creds); err != nil {
		return nil, nil, err
	}
	topts, err := g.tls.Options()
	if err != nil {
		return nil, nil, err
	}
	return daemon.Connect(g.nats, g.creds, mesh.OperatorPrincipal, "builds", append(topts, opts...)...)
}

// operatorCreds refuses a credentials file issued to one of the mesh's
// principals other than the operator (the controller, an agent, a node, a
// module), naming whose it is and where the operator's are. A file it
// cannot read, or of a principal the mesh did not issue, is left to the
// server.
func operatorCreds(path string) error {
	if path == "" {
		return nil
	}
	id, err := creds.PrincipalOf(path)
	if err != nil || id == mesh.OperatorPrincipal {
		return nil
	}
	for _, kind := range mesh.PrincipalKinds {
		if id == kind || strings.HasPrefix(id, mesh.PrincipalID(kind, "")) {
			return fmt.Errorf("the credentials in %s are %s's, and builds speaks as the operator: use the operator's (builds up keeps them in STATE/creds/operator.creds; else builds creds issue KEYS --principal operator --out FILE), with --creds or MESHBUILD_CREDS", path, id)
		}
	}
	return nil
}

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
	return rec, mods, cascade.Readable(err, b.warn)
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
