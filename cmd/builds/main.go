// Command builds operates a meshbuild build farm. See `builds --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshbuild/meshbuild/cmd/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
