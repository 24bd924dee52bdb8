package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nats-io/nats.go"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/state"
)

func init() { extraCommands = append(extraCommands, stateCmd) }

// stateCmd is `builds state`: a module's buckets (ADR 0201) read and
// written by the operator, under the operator's derived permissions and the
// runtime's own rules (limits, no credential-named field).
func stateCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "state",
		Short: "Read and write a module's state (its key-value buckets) as the operator",
		Example: `  builds state keys build-agent.builds
  builds state get build-agent.builds app
  echo '{"note":"pinned"}' | builds state put my-module.settings app
  builds state watch build-agent.builds --current`,
	}
	c.AddCommand(&cobra.Command{
		Use:   "get MODULE.BUCKET KEY",
		Short: "Print a key's current value",
		Args:  exactArgs(2),
		RunE: g.withState(func(cmd *cobra.Command, st *state.Store, bucket string, args []string) error {
			ctx := cmd.Context()
			e, err := st.Get(ctx, bucket, args[1])
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(g.out, entryView{Bucket: bucket, Key: e.Key, Value: string(e.Value), Revision: e.Revision, Created: e.Created})
			}
			fmt.Fprintln(g.out, string(e.Value))
			return nil
		}),
	})
	c.AddCommand(&cobra.Command{
		Use:   "put MODULE.BUCKET KEY [VALUE]",
		Short: "Write a key's value (from VALUE, or standard input); refused over 256 KiB or with a credential-named field",
		Args:  rangeArgs(2, 3),
		RunE: g.withState(func(cmd *cobra.Command, st *state.Store, bucket string, args []string) error {
			ctx := cmd.Context()
			var value []byte
			if len(args) == 3 {
				value = []byte(args[2])
			} else {
				data, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), mesh.BucketMaxValue+1))
				if err != nil {
					return fmt.Errorf("reading the value from standard input: %w", err)
				}
				value = []byte(strings.TrimSuffix(string(data), "\n"))
			}
			rev, err := st.Put(ctx, bucket, args[1], value)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(g.out, entryView{Bucket: bucket, Key: args[1], Revision: rev})
			}
			fmt.Fprintf(g.out, "%s %s: revision %d\n", bucket, args[1], rev)
			return nil
		}),
	})
	c.AddCommand(&cobra.Command{
		Use:   "keys MODULE.BUCKET",
		Short: "List the keys with a value",
		Args:  exactArgs(1),
		RunE: g.withState(func(cmd *cobra.Command, st *state.Store, bucket string, _ []string) error {
			ctx := cmd.Context()
			keys, err := st.Keys(ctx, bucket)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(g.out, keys)
			}
			for _, k := range keys {
				fmt.Fprintln(g.out, k)
			}
			return nil
		}),
	})
	var current bool
	watch := &cobra.Command{
		Use:   "watch MODULE.BUCKET",
		Short: "Print the current values, a line marking their end, then every change until interrupted",
		Args:  exactArgs(1),
		RunE: g.withState(func(cmd *cobra.Command, st *state.Store, bucket string, _ []string) error {
			ctx := cmd.Context()
			w, err := st.Watch(ctx, bucket)
			if err != nil {
				return err
			}
			defer w.Stop()
			for e := range w.Events() {
				if g.json {
					if err := writeJSONLine(g.out, eventView{Kind: string(e.Kind), Key: e.Key, Value: string(e.Value), Revision: e.Revision}); err != nil {
						return err
					}
				} else {
					switch e.Kind {
					case state.Current:
						fmt.Fprintln(g.out, "-- current values above; changes below --")
					case state.Deleted:
						fmt.Fprintf(g.out, "deleted %s\n", e.Key)
					default:
						fmt.Fprintf(g.out, "%s = %s\n", e.Key, e.Value)
					}
				}
				if current && e.Kind == state.Current {
					return nil
				}
			}
			return nil
		}),
	}
	watch.Flags().BoolVar(&current, "current", false, "stop after the current values")
	c.AddCommand(watch)
	return c
}

type entryView struct {
	Bucket   string    `json:"bucket"`
	Key      string    `json:"key"`
	Value    string    `json:"value,omitempty"`
	Revision uint64    `json:"revision"`
	Created  time.Time `json:"created,omitzero"`
}

type eventView struct {
	Kind     string `json:"kind"`
	Key      string `json:"key,omitempty"`
	Value    string `json:"value,omitempty"`
	Revision uint64 `json:"revision,omitempty"`
}

// operatorBucket is the bucket an operator names as MODULE.BUCKET, issued
// read-write: what the operator may do is the server's (its derived set),
// the rules on values are the runtime's.
func operatorBucket(ref string) (mesh.IssuedBucket, error) {
	module, bucket, ok := mesh.SplitRef(ref)
	if !ok || !mesh.ValidName(module) || !mesh.ValidName(bucket) {
		return mesh.IssuedBucket{}, fmt.Errorf("%q: name a bucket as MODULE.BUCKET, the module and the state name its manifest declares (e.g. build-agent.builds)", ref)
	}
	return mesh.IssuedBucket{Name: ref, Bucket: mesh.KVBucket(module, bucket), Write: true}, nil
}

// withState makes a state subcommand's RunE: the bucket named by the first
// argument, served through a state.Store on the operator's connection.
func (g *globals) withState(fn func(cmd *cobra.Command, st *state.Store, bucket string, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		b, err := operatorBucket(args[0])
		if err != nil {
			return err
		}
		// A write the operator's credentials do not grant (the
		// controller's own state, the agents' records) is refused by the
		// server: said at once, with what to do instead.
		ctx, cancel := context.WithCancelCause(cmd.Context())
		defer cancel(nil)
		refused := nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				cancel(fmt.Errorf("%s is read-only to the operator (%w): it is the farm's own record; change it through the controller's tools (builds retry, rebuild, cancel, priority, assign)", b.Name, err))
			}
		})
		nc, js, err := g.dial(refused)
		if err != nil {
			return err
		}
		defer nc.Close()
		cmd.SetContext(ctx)
		st := state.New(js, mesh.OperatorPrincipal, []mesh.IssuedBucket{b})
		err = fn(cmd, st, b.Name, args)
		if cause := context.Cause(ctx); err != nil && cause != nil && cmd.Context().Err() != nil {
			return cause
		}
		if errors.Is(err, state.ErrNotFound) {
			return fmt.Errorf("%w; see `builds state keys %s`", err, b.Name)
		}
		return err
	}
}

// rangeArgs takes from min to max arguments, said as exactArgs says it.
func rangeArgs(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) >= lo && len(args) <= hi {
			return nil
		}
		return argsError(cmd, args, fmt.Sprintf("%d to %d arguments", lo, hi))
	}
}

// writeJSONLine writes v as one line of JSON (a stream of events).
func writeJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// liveOrphans asks the bus what it keeps that cat no longer declares
// (`catalogue show --live`), as the operator.
func liveOrphans(ctx context.Context, g *globals, cat *mesh.Catalogue) ([]string, error) {
	nc, js, err := g.dial()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	out, err := mesh.Orphans(ctx, js, cat)
	if err != nil {
		return nil, fmt.Errorf("asking %s what outlived its declaration: %w", g.nats, err)
	}
	return nonNil(out), nil
}

func printOrphans(g *globals, orphans []string) {
	if orphans == nil {
		return
	}
	fmt.Fprintln(g.out, "\nkept on the bus, declaration gone (reported, never removed; delete by hand if it is no longer wanted)")
	if len(orphans) == 0 {
		fmt.Fprintln(g.out, "  none")
	}
	for _, o := range orphans {
		fmt.Fprintf(g.out, "  %s\n", o)
	}
}
