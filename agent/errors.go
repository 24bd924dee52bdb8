package agent

import (
	"context"
	"errors"
	"strings"

	"github.com/meshbuild/meshbuild/mesh"
)

// The classes of a failed ask, matched with errors.Is. Every error Sources
// and BuildKit return wraps exactly one of them; Classify maps them to the
// reason a failed announces.
var (
	// ErrSource: the repository, commit, path or Dockerfile is missing.
	// Deterministic: settled and reported once.
	ErrSource = errors.New("source")
	// ErrBuild: the Dockerfile failed (a RUN exited non-zero, a parse error,
	// a file missing from the context, a base that is not there).
	// Deterministic.
	ErrBuild = errors.New("build")
	// ErrPush: the registry refused the image (a 4xx answer). Deterministic.
	ErrPush = errors.New("push")
	// ErrInfra: buildkitd, the registry or the git server could not be
	// reached, or answered 5xx. Retried with a delay and a bound.
	ErrInfra = errors.New("infra")
)

// Error is a classified failure: Kind is one of ErrSource, ErrBuild, ErrPush
// or ErrInfra, Msg one line for a person (for a failed build, the build's
// own last meaningful line), Err the cause. errors.Is matches both Kind and
// anything in Err's chain.
type Error struct {
	Kind error
	Msg  string
	Err  error
}

func (e *Error) Error() string {
	if e.Msg == "" && e.Err != nil {
		return e.Kind.Error() + ": " + e.Err.Error()
	}
	return e.Kind.Error() + ": " + e.Msg
}

// Unwrap returns the class and the cause.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

func classified(kind error, msg string, err error) error {
	return &Error{Kind: kind, Msg: msg, Err: err}
}

// Classify returns the reason class of err, one of mesh.Reason*: a
// cancelled context is mesh.ReasonCancel, an ask the agent cannot read is
// mesh.ReasonAsk, then the class err wraps. An error of no known class is
// taken for infrastructure, which is retried before it is reported.
func Classify(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.Canceled):
		return mesh.ReasonCancel
	case errors.Is(err, mesh.ErrMalformedAsk), errors.Is(err, mesh.ErrAskVersion):
		return mesh.ReasonAsk
	case errors.Is(err, ErrSource):
		return mesh.ReasonSource
	case errors.Is(err, ErrBuild):
		return mesh.ReasonBuild
	case errors.Is(err, ErrPush):
		return mesh.ReasonPush
	default:
		return mesh.ReasonInfra
	}
}

// lastLine returns the last non-empty line of s, trimmed: build tools put
// the line that matters last.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}
