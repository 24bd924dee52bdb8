// Package cli is the builds command: the operator's view of the farm and
// its verbs. Each command is a thin layer over a package; cmd/builds only
// owns signals and the exit status.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// ErrFailed is returned when a command has already printed why it failed and
// only the exit status remains to be set (e.g. a catalogue with problems).
var ErrFailed = errors.New("failed")

// globals are the flags every command shares.
type globals struct {
	nats  string
	creds string
	json  bool
	out   io.Writer
	errw  io.Writer
}

// NewRoot returns the builds command tree.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{out: stdout, errw: stderr}
	root := &cobra.Command{
		Use:           "builds",
		Short:         "Operate a meshbuild build farm: catalogues, plans, machines, logs",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	def := os.Getenv("MESHBUILD_NATS")
	if def == "" {
		def = "nats://127.0.0.1:4222"
	}
	root.PersistentFlags().StringVar(&g.nats, "nats", def, "NATS server URL(s), comma separated (env MESHBUILD_NATS)")
	root.PersistentFlags().StringVar(&g.creds, "creds", os.Getenv("MESHBUILD_CREDS"), "NATS credentials file (env MESHBUILD_CREDS)")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print JSON (stable field names, see README)")
	root.AddCommand(catalogueCmd(g))
	for _, add := range extraCommands {
		root.AddCommand(add(g))
	}
	return root
}

// extraCommands are registered by the files that define them.
var extraCommands []func(*globals) *cobra.Command

// Main runs the builds command and returns the process exit status.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewRoot(stdout, stderr)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		if !errors.Is(err, ErrFailed) {
			fmt.Fprintln(stderr, "builds:", err)
		}
		return 1
	}
	return 0
}
