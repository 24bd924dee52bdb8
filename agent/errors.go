package agent

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"syscall"

	gatewaypb "github.com/moby/buildkit/frontend/gateway/pb"
	"github.com/moby/buildkit/solver/errdefs"
	"github.com/moby/buildkit/util/grpcerrors"
	"google.golang.org/grpc/codes"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
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

// step is where in a build a failure happened: what an answer that no
// earlier row of the causes table explains means depends on it.
type step int

const (
	// stepSolve is BuildKit's solve before the export: resolving and
	// pulling bases, the Dockerfile, its RUN steps.
	stepSolve step = iota
	// stepPush is BuildKit's export: pushing the image's blobs and
	// manifests, and the tag.
	stepPush
	// stepRegistry is a registry call of the agent's own after the push
	// (verifying the digest, reading the attestations, tagging).
	stepRegistry
)

// failure is what the causes table reads of a failed step.
type failure struct {
	err  error
	step step
	// status is the registry's HTTP answer the error carries (0: none);
	// at the push, where BuildKit passes the registry's code along in
	// words but not its status, the status distribution answers that code
	// with. said is that code ("BLOB_UPLOAD_UNKNOWN"), when found so.
	status int
	said   string
	// down names a registry of the build that does not answer (a ping
	// unreachable or 5xx), with its error; "" when all answer or none was
	// asked. It is asked only when no earlier row decided.
	down func() (host string, err error)
}

func (f *failure) text() string { return f.err.Error() }

// cause is one row of the causes table: a name for people (and for the
// message), the class it gives, and what it matches.
type cause struct {
	name  string
	class error
	match func(f *failure) bool
}

// causes is the agent's one table of failures by cause, in order: the
// first row that matches decides the class. Infrastructure (ErrInfra) is
// what may pass — retried by the agent within its --retry-for budget,
// then failed{infra}; the deterministic classes (ErrBuild, ErrPush) are
// reported once. A registry's own words (its status, its code and message,
// its detail) stay in the message whatever the row.
//
//	row                            class   matches
//	buildkitd unreachable          infra   gRPC Unavailable from the daemon
//	a RUN exited non-zero          build   the daemon's ExitError
//	disk full                      infra   ENOSPC, "no space left on device" (the registry's or the daemon's)
//	registry rate limit (429)      infra   the registry answered 429 Too Many Requests
//	registry timeout (408)         infra   the registry answered 408 Request Timeout
//	registry failure (5xx)         infra   the registry answered 500–599
//	registry lost the upload       infra   BLOB_UPLOAD_UNKNOWN at the push: the upload is gone
//	                                       (a full disk, a restart, replicas without shared storage)
//	registry refusal (4xx)         push    any other 4xx to a push or a call after it: 400 manifest
//	                                       invalid, 401, 403 denied, 404 name unknown
//	registry unreachable           infra   refused, reset, unresolvable, timed out (typed, or in words)
//	registry down                  infra   a registry of the build does not answer a ping (unreachable, 5xx)
//	the Dockerfile                 build   BuildKit located the error in the Dockerfile or an op failed
//	a base refused (4xx)           build   a 4xx while resolving a base: the base is not there, or not ours to read
//	the push                       push    anything else at the push or after it
//	the build                      build   anything else
var causes = []cause{
	{"buildkitd unreachable", ErrInfra, func(f *failure) bool { return grpcerrors.Code(f.err) == codes.Unavailable }},
	{"a RUN exited non-zero", ErrBuild, func(f *failure) bool {
		var exit *gatewaypb.ExitError
		return errors.As(f.err, &exit)
	}},
	{"disk full", ErrInfra, func(f *failure) bool {
		return errors.Is(f.err, syscall.ENOSPC) || strings.Contains(f.text(), "no space left on device")
	}},
	{"registry rate limit", ErrInfra, func(f *failure) bool { return f.status == http.StatusTooManyRequests }},
	{"registry timeout", ErrInfra, func(f *failure) bool { return f.status == http.StatusRequestTimeout }},
	{"registry failure", ErrInfra, func(f *failure) bool { return f.status >= 500 }},
	{"registry lost the upload", ErrInfra, func(f *failure) bool { return f.said == "BLOB_UPLOAD_UNKNOWN" }},
	{"registry refusal", ErrPush, func(f *failure) bool { return f.status >= 400 && f.status < 500 && f.step != stepSolve }},
	{"registry unreachable", ErrInfra, func(f *failure) bool { return registry.Unreachable(f.err) }},
	{"registry down", ErrInfra, func(f *failure) bool {
		if f.down == nil {
			return false
		}
		host, _ := f.down()
		return host != ""
	}},
	{"the Dockerfile", ErrBuild, func(f *failure) bool {
		var solve *errdefs.SolveError
		return f.step == stepSolve && (errors.As(f.err, &solve) || len(errdefs.Sources(f.err)) > 0)
	}},
	{"a base refused", ErrBuild, func(f *failure) bool { return f.status >= 400 && f.status < 500 }},
	{"the push", ErrPush, func(f *failure) bool { return f.step != stepSolve }},
	{"the build", ErrBuild, func(*failure) bool { return true }},
}

// classOf returns the first row of causes that matches f.
func classOf(f *failure) cause {
	if code, ok := registry.Status(f.err); ok {
		f.status = code
	} else if said, ok := registry.SaidIn(f.text()); ok && f.step == stepPush {
		f.status, f.said = said.Status, said.Code
	}
	for _, c := range causes {
		if c.match(f) {
			return c
		}
	}
	return causes[len(causes)-1]
}

// registryWords is what a registry said, in the words an error carries:
// every line of its text (containerd puts the registry's code and message
// on the lines after its status), joined on one line.
func registryWords(err error) string {
	var out []string
	for _, l := range strings.Split(err.Error(), "\n") {
		l = strings.TrimPrefix(strings.TrimSpace(l), "error: ")
		if l != "" && !strings.Contains(strings.Join(out, ": "), l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, ": ")
}

// lastLine returns the last non-empty line of s, trimmed: build tools put
// the line that matters last.
// saying is msg, what failed, with err's own last word on why: git's (the
// last line it wrote) for a git command, else err's last line. A
// classified error says its Msg alone, so a Msg that only names what
// failed would hide the cause (by hand: "infra: fetching
// https://git.example/fleet.git", nothing on why).
func saying(msg string, err error) string {
	if err == nil {
		return msg
	}
	why := err.Error()
	var ge *gitcache.Error
	if errors.As(err, &ge) {
		why = ge.Why()
	}
	return msg + ": " + lastLine(why)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}
