package seat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/mesh"
)

// DefaultToolTimeout bounds a tool request, on the server (the owner's work
// on it) and on the client (when the caller's context has no deadline).
const DefaultToolTimeout = 30 * time.Second

// ErrNoController is returned by Call when nobody serves the tool.
var ErrNoController = errors.New("no controller answered")

// Tool is one request/reply subject a controller serves.
type Tool struct {
	Name    string
	Subject string
}

// Inbox hands requests of type Q to the goroutine that owns a controller's
// state, which answers each with an R: it receives a Letter from the inbox
// and calls Answer.
type Inbox[Q, R any] chan Letter[Q, R]

// Letter is one request in an Inbox.
type Letter[Q, R any] struct {
	Q     Q
	reply chan R
}

// Answer gives the sender its answer; call it once.
func (l Letter[Q, R]) Answer(r R) { l.reply <- r }

// Do sends q to the owner and waits for its answer; the error is ctx's when
// ctx is done first.
func (in Inbox[Q, R]) Do(ctx context.Context, q Q) (R, error) {
	l := Letter[Q, R]{Q: q, reply: make(chan R, 1)}
	var zero R
	select {
	case in <- l:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	select {
	case r := <-l.reply:
		return r, nil
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// Serve answers each tool on nc: a request is decoded into a Req and given
// to handle with a context bounded by timeout (0: DefaultToolTimeout); one
// that does not decode is answered with malformed's reply. The caller
// unsubscribes the subscriptions, also those returned with an error.
func Serve[Req, Rep any](nc *nats.Conn, tools []Tool, timeout time.Duration, handle func(ctx context.Context, tool string, req Req) Rep, malformed func(error) Rep) ([]*nats.Subscription, error) {
	if timeout <= 0 {
		timeout = DefaultToolTimeout
	}
	var subs []*nats.Subscription
	for _, t := range tools {
		sub, err := nc.Subscribe(t.Subject, func(m *nats.Msg) {
			var req Req
			var r Rep
			if err := json.Unmarshal(m.Data, &req); err != nil {
				r = malformed(err)
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				r = handle(ctx, t.Name, req)
				cancel()
			}
			data, _ := json.Marshal(r)
			_ = m.Respond(data)
		})
		if err != nil {
			return subs, fmt.Errorf("serving %s: %w", t.Subject, err)
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// Command is what a controller's goroutine is handed through its Inbox: a
// tool's request (Kind the tool's name, Req the request) or a changed
// catalogue (Kind "catalogue", Cat).
type Command[Req any] struct {
	Kind string
	Req  Req
	Cat  *mesh.Catalogue
}

// ServeInbox serves tools on nc (Serve) by handing each request, as a
// Command of the tool's name, to the owner of in and answering with its
// answer; one the owner does not take or answer in time is answered with
// lost's reply (of ctx's error), one that does not decode with
// malformed's.
func ServeInbox[Req, Rep any](nc *nats.Conn, tools []Tool, timeout time.Duration, in Inbox[Command[Req], Rep], lost, malformed func(error) Rep) ([]*nats.Subscription, error) {
	return Serve(nc, tools, timeout, func(ctx context.Context, tool string, req Req) Rep {
		r, err := in.Do(ctx, Command[Req]{Kind: tool, Req: req})
		if err != nil {
			return lost(err)
		}
		return r
	}, malformed)
}

// SetCatalogue hands cat to the owner of in as a Command of kind
// "catalogue" and returns the error its answer carries (or ctx's).
func SetCatalogue[Req any, Rep Answer](ctx context.Context, in Inbox[Command[Req], Rep], cat *mesh.Catalogue) error {
	r, err := in.Do(ctx, Command[Req]{Kind: "catalogue", Cat: cat})
	if err != nil {
		return err
	}
	if msg, _ := r.Failure(); msg != "" {
		return errors.New(msg)
	}
	return nil
}

// Answer is a tool's reply as Call reads it: its error message and code,
// both empty for a success.
type Answer interface {
	Failure() (message, code string)
}

// CallOption changes how Call asks.
type CallOption func(*callOptions)

type callOptions struct {
	timeout time.Duration
}

// WithTimeout bounds a call whose context has no deadline (default
// DefaultToolTimeout); d ≤ 0 keeps the default.
func WithTimeout(d time.Duration) CallOption {
	return func(o *callOptions) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// Call sends req to tool and decodes the reply. who names the server in
// errors ("the controller"). An error reply is returned with the reply as
// an *Error of codes, which errors.Is matches against the sentinels its
// code names; nobody serving the tool is ErrNoController.
func Call[Rep Answer](ctx context.Context, nc *nats.Conn, who string, tool Tool, req any, codes Codes, opts ...CallOption) (Rep, error) {
	o := callOptions{timeout: DefaultToolTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	var r Rep
	data, err := json.Marshal(req)
	if err != nil {
		return r, fmt.Errorf("encoding a request to %s: %w", tool.Subject, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	m, err := nc.RequestWithContext(ctx, tool.Subject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return r, fmt.Errorf("%w: is build-controller running? (%s)", ErrNoController, tool.Subject)
	}
	if err != nil {
		return r, fmt.Errorf("asking %s to %s: %w", who, tool.Name, err)
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return r, fmt.Errorf("decoding the answer of %s: %w", who, err)
	}
	if msg, code := r.Failure(); msg != "" {
		return r, codes.Error(code, msg)
	}
	return r, nil
}

// Code is one entry of a code table: the code an error crosses the wire
// with, and the sentinels an error of the code matches, its own first.
type Code struct {
	Code      string
	Sentinels []error
}

// Codes is an ordered table of error codes. The server answers an error
// with Of; the client turns the code back into an error with Error.
type Codes []Code

// Of is err's code: that of the first entry whose first sentinel err
// wraps, "" when none does. The order decides for an error wrapping two.
func (cs Codes) Of(err error) string {
	for _, c := range cs {
		if len(c.Sentinels) > 0 && errors.Is(err, c.Sentinels[0]) {
			return c.Code
		}
	}
	return ""
}

// Error is the error a reply with message and code stands for.
func (cs Codes) Error(code, message string) *Error {
	return &Error{Code: code, Message: message, codes: cs}
}

// Match reports whether target is one of code's sentinels.
func (cs Codes) Match(code string, target error) bool {
	for _, c := range cs {
		if c.Code == code && slices.Contains(c.Sentinels, target) {
			return true
		}
	}
	return false
}

// Error is an error answer as the client receives it: the server's
// message, once, and its code, which errors.Is matches against the
// sentinels its table gives the code.
type Error struct {
	Code    string
	Message string
	codes   Codes
}

func (e *Error) Error() string { return e.Message }

// Is reports whether target is one of the sentinels of e's code.
func (e *Error) Is(target error) bool { return e.codes.Match(e.Code, target) }
