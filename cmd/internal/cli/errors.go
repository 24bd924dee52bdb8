package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meshbuild/meshbuild/cascade"
)

// refusal is the controller's refusal of a tool request as the operator
// reads it: the controller's own words once, then what to do next.
// errors.Is still matches the sentinel cascade.Call classified it as.
type refusal struct {
	msg string
	err error
}

func (e *refusal) Error() string { return e.msg }
func (e *refusal) Unwrap() error { return e.err }

// refused says a tool's refusal once: the reply's message (Call's error
// repeats the sentinel in front of it), then next, the command to run.
func refused(r cascade.Reply, err error, next string) error {
	msg := r.Error
	if msg == "" {
		msg = err.Error()
	}
	if next != "" {
		msg += "; " + next
	}
	return &refusal{msg: msg, err: err}
}

// exactArgs is cobra.ExactArgs saying what the command takes and how to
// call it, instead of "accepts 2 arg(s), received 3".
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == n {
			return nil
		}
		return argsError(cmd, args, fmt.Sprintf("%d argument%s", n, plural(n)))
	}
}

// minimumArgs is cobra.MinimumNArgs, said as exactArgs says it.
func minimumArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) >= n {
			return nil
		}
		return argsError(cmd, args, fmt.Sprintf("at least %d argument%s", n, plural(n)))
	}
}

func argsError(cmd *cobra.Command, args []string, want string) error {
	got := "none"
	if len(args) > 0 {
		got = fmt.Sprintf("%d (%s)", len(args), strings.Join(args, " "))
	}
	use := strings.TrimSuffix(cmd.UseLine(), " [flags]")
	return fmt.Errorf("%s takes %s, got %s; usage: %s (see %s --help)", cmd.CommandPath(), want, got, use, cmd.CommandPath())
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
