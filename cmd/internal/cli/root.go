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

	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/cmd/internal/farm"
)

// ErrFailed is returned when a command has already printed why it failed and
// only the exit status remains to be set (e.g. a catalogue with problems).
var ErrFailed = errors.New("failed")

// globals are the flags every command shares.
type globals struct {
	nats  string
	creds string
	tls   daemon.TLS
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
	root.PersistentFlags().StringVar(&g.creds, "creds", defaultCreds(), "NATS credentials file (env MESHBUILD_CREDS; default the operator's in the state directory of builds up, which keeps them there)")
	root.PersistentFlags().StringVar(&g.tls.CA, "tls-ca", os.Getenv("MESHBUILD_TLS_CA"), "CA certificate (PEM) that signed the NATS server's, for a TLS server (env MESHBUILD_TLS_CA)")
	root.PersistentFlags().StringVar(&g.tls.Cert, "tls-cert", os.Getenv("MESHBUILD_TLS_CERT"), "client certificate (PEM) for a NATS server that verifies clients; with --tls-key (env MESHBUILD_TLS_CERT)")
	root.PersistentFlags().StringVar(&g.tls.Key, "tls-key", os.Getenv("MESHBUILD_TLS_KEY"), "the client certificate's key (PEM) (env MESHBUILD_TLS_KEY)")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print JSON (stable field names, see README)")
	root.AddCommand(catalogueCmd(g))
	for _, add := range extraCommands {
		root.AddCommand(add(g))
	}
	return root
}

// defaultCreds is MESHBUILD_CREDS, else the operator's credentials in the
// state directory of builds up (farm.DefaultStateDir: MESHBUILD_STATE, else
// the XDG state directory; builds up issues them there), else none.
func defaultCreds() string {
	if c := os.Getenv("MESHBUILD_CREDS"); c != "" {
		return c
	}
	if st, err := farm.DefaultStateDir(); err == nil {
		if p := farm.OperatorCredsIn(st); fileExists(p) {
			return p
		}
	}
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

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
