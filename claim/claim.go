package claim

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/kvsnap"
	"github.com/meshbuild/meshbuild/mesh"
)

// Defaults of a claim's lease.
const (
	// DefaultLease is how long a claim outlives its holder's last renewal.
	DefaultLease = 15 * time.Second
)

var (
	// ErrClaimed is matched (errors.Is) by the refusal of a seat another
	// holder has; the error is a *ClaimedError naming that holder.
	ErrClaimed = errors.New("seat already claimed")
	// ErrLost is matched by Lease.Err after the claim was lost: a renewal
	// was refused, or none succeeded for a whole lease.
	ErrLost = errors.New("claim lost")
	// ErrLapsed is matched, beside ErrLost, by the loss of a claim that
	// lapsed (no renewal reached the server within the lease: the holder
	// was cut off or stalled) rather than was taken by another: its key
	// may be free to claim again.
	ErrLapsed = errors.New("claim lapsed")
	// ErrReleased is Lease.Err after Release.
	ErrReleased = errors.New("claim released")
	// ErrOption is wrapped by every refusal of an option or argument.
	ErrOption = errors.New("invalid claim")
)

// Scope is where a seat has one holder: the whole mesh, or one node.
type Scope struct{ node string }

// Mesh is the scope of a mesh-scoped seat: one holder in the mesh.
func Mesh() Scope { return Scope{} }

// Node is the scope of a node-scoped seat on node name: one holder there.
func Node(name string) Scope { return Scope{node: name} }

// Node is the scope's node; empty for Mesh.
func (s Scope) Node() string { return s.node }

// String is "mesh" or "node NAME".
func (s Scope) String() string {
	if s.node == "" {
		return mesh.ScopeMesh
	}
	return mesh.ScopeNode + " " + s.node
}

// Record is the value of a claim.
type Record struct {
	Seat  string `json:"seat"`
	Scope string `json:"scope"` // mesh or node
	Node  string `json:"node,omitempty"`
	// Holder says who holds the seat, for people: a process and a machine.
	Holder string `json:"holder"`
	// Since is when the holder claimed the seat; Renewed is its last
	// renewal. Both are the holder's clock.
	Since   time.Time `json:"since"`
	Renewed time.Time `json:"renewed"`
	// Lease is how long the claim outlives its last renewal.
	Lease string `json:"lease"`
	// Token tells this claim from an earlier one of the same holder.
	Token string `json:"token"`
}

func (r Record) scope() Scope { return Scope{node: r.Node} }

// ClaimedError refuses a claim: the seat has a holder at that scope.
type ClaimedError struct {
	Record Record
}

func (e *ClaimedError) Error() string {
	return fmt.Sprintf("seat %s (%s) is held by %q since %s", e.Record.Seat, e.Record.scope(),
		e.Record.Holder, e.Record.Since.Format(time.RFC3339))
}

// Is matches ErrClaimed.
func (e *ClaimedError) Is(target error) bool { return target == ErrClaimed }

// Option configures a claim.
type Option func(*options) error

type options struct {
	lease, renew time.Duration
	log          *slog.Logger
	clock        func() time.Time
	resume       bool
	trouble      func()
	raise        func(ctx context.Context) error
}

// WithRaise has the claims bucket raised with raise when it is not there,
// instead of waited for: for the controller, which raises it (a server
// started again on an empty store has lost it).
func WithRaise(raise func(ctx context.Context) error) Option {
	return func(o *options) error { o.raise = raise; return nil }
}

// WithResume makes a lapsed claim claimed again under its own token instead
// of lost: a holder whose renewals did not reach the server within the
// lease (the bus away, the holder stalled) writes the claim again, the key
// created only if it is absent, and holds on as it was, with everything
// bound to the claim (a machine's ask claims) bound again. Only another
// claim on the key loses it. For a seat whose scope has one contender (a
// node's own agent), where stopping the work for a lapse buys nothing: a
// standby elsewhere cannot take it. Not for a mesh-scoped seat: there a
// lapse must stop the holder before a standby can take over.
func WithResume() Option {
	return func(o *options) error { o.resume = true; return nil }
}

// WithLease sets how long a claim outlives its holder's last renewal: the
// longest a seat stays held after its holder died. The server counts whole
// seconds, so it must be a whole number of seconds, at least one.
func WithLease(d time.Duration) Option {
	return func(o *options) error { o.lease = d; return nil }
}

// WithRenew sets how often the holder renews, and how often a standby looks
// again; the default is a third of the lease.
func WithRenew(d time.Duration) Option {
	return func(o *options) error { o.renew = d; return nil }
}

// WithClock sets the clock a claim's record reads its times from (since,
// renewed): for people only. Whether a claim is alive is judged on the
// server's clock alone (the key's TTL), never on this one, so a holder
// whose clock is wrong holds exactly as long as one whose clock is right.
func WithClock(now func() time.Time) Option {
	return func(o *options) error { o.clock = now; return nil }
}

// WithTrouble has f called each time a renewal, or the write of a lapsed
// claim again, gets no answer from the bus in time, or is answered only
// after slowRenewal (a bus that stood still — a cluster without quorum —
// answers the renewal in flight when it returns: how a machine that only
// waits on its pull sees an outage end), and when the claim lapses with
// its holder alive: its holder saw the bus fail (or stood still itself
// for a lease). A bus that stops answering without dropping
// the connection (a server frozen, a network that drops packets) is seen
// only so; the holder then knows that every claim on that bus may have
// lapsed with its own, its holder alive (agent: a redelivered ask with no
// claim left is left a while to its holder, instead of built twice).
func WithTrouble(f func()) Option {
	return func(o *options) error { o.trouble = f; return nil }
}

// troubled calls the WithTrouble hook, if any.
func (o options) troubled() {
	if o.trouble != nil {
		o.trouble()
	}
}

// WithLogger has the claim say what it does (standby, takeover, loss).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error { o.log = l; return nil }
}

// makeOptions applies opts over the defaults and refuses what cannot work.
func makeOptions(opts []Option) (options, error) {
	o := options{lease: DefaultLease}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	if o.lease == 0 {
		o.lease = DefaultLease
	}
	if o.lease < time.Second || o.lease%time.Second != 0 {
		return o, fmt.Errorf("%w: lease %s: the server counts a claim's lease in whole seconds; use 1s or more, e.g. %s", ErrOption, o.lease, DefaultLease)
	}
	if o.lease > mesh.ClaimMaxLease {
		return o, fmt.Errorf("%w: lease %s: at most %s (the claims bucket keeps nothing longer)", ErrOption, o.lease, mesh.ClaimMaxLease)
	}
	if o.clock == nil {
		o.clock = time.Now
	}
	if o.renew == 0 {
		o.renew = o.lease / 3
	}
	if o.renew <= 0 || o.renew >= o.lease {
		return o, fmt.Errorf("%w: renewing every %s with a lease of %s: renew well inside the lease (default a third of it)", ErrOption, o.renew, o.lease)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// nodeRE is what a node's name may be to name a claim's key.
var nodeRE = regexp.MustCompile(`^[A-Za-z0-9_=-]+(\.[A-Za-z0-9_=-]+)*$`)

func checkArgs(seat string, scope Scope, holder string) error {
	if !mesh.ValidName(seat) {
		return fmt.Errorf("%w: seat %q is not a seat's name ([a-z0-9-]+)", ErrOption, seat)
	}
	if scope.node != "" && !nodeRE.MatchString(scope.node) {
		return fmt.Errorf("%w: node %q cannot name a claim: use letters, digits, '-', '_' and '.' between them", ErrOption, scope.node)
	}
	if holder == "" {
		return fmt.Errorf("%w: no holder: say who claims %s (e.g. a process and its machine)", ErrOption, seat)
	}
	return nil
}

// bucket opens the claims bucket, waiting (ctx bounds it) while it is not
// raised yet: the controller raises it.
func bucket(ctx context.Context, js jetstream.JetStream, o options) (jetstream.KeyValue, error) {
	delay := 250 * time.Millisecond
	for {
		kv, err := js.KeyValue(ctx, mesh.ClaimsBucket())
		if err == nil {
			return kv, nil
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("opening the claims bucket %s: %w", mesh.ClaimsBucket(), err)
		}
		if o.raise != nil {
			o.log.Warn("the claims bucket is not there (a server started again on an empty store?): raising it", "bucket", mesh.ClaimsBucket())
			rerr := o.raise(ctx)
			if rerr == nil {
				continue
			}
			o.log.Warn("raising the claims bucket", "bucket", mesh.ClaimsBucket(), "err", rerr)
		} else {
			o.log.Warn("the claims bucket is not raised yet; waiting for the controller", "bucket", mesh.ClaimsBucket())
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("opening the claims bucket %s: %w (start build-controller: it raises it)", mesh.ClaimsBucket(), ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// Claim claims seat at scope for holder, or refuses with a *ClaimedError
// (errors.Is ErrClaimed) naming the holder it has. It waits, within ctx,
// for the claims bucket to be raised. The returned Lease renews the claim
// until Release, or until it is lost.
func Claim(ctx context.Context, js jetstream.JetStream, seat string, scope Scope, holder string, opts ...Option) (*Lease, error) {
	o, err := makeOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := checkArgs(seat, scope, holder); err != nil {
		return nil, err
	}
	kv, err := bucket(ctx, js, o)
	if err != nil {
		return nil, err
	}
	return claim(ctx, js, kv, seat, scope, holder, o)
}

func claim(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, seat string, scope Scope, holder string, o options) (*Lease, error) {
	key := mesh.ClaimKey(seat, scope.node)
	kind := mesh.ScopeMesh
	if scope.node != "" {
		kind = mesh.ScopeNode
	}
	now := o.clock().UTC()
	rec := Record{Seat: seat, Scope: kind, Node: scope.node, Holder: holder, Since: now, Renewed: now,
		Lease: o.lease.String(), Token: rand.Text()}
	data, _ := json.Marshal(rec)
	// A claim that lapses between the refusal and the read is tried again.
	for range 3 {
		sent := time.Now()
		rev, err := kv.Create(ctx, key, data, jetstream.KeyTTL(o.lease))
		if err == nil {
			return newSeatLease(js, kv, key, rec, rev, sent, o), nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("claiming %s (%s): %w", seat, scope, err)
		}
		cur, err := read(ctx, kv, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the claim of %s (%s): %w", seat, scope, err)
		}
		return nil, &ClaimedError{Record: cur}
	}
	return nil, fmt.Errorf("claiming %s (%s): the claim changed hands three times while it was read; try again", seat, scope)
}

func read(ctx context.Context, kv jetstream.KeyValue, key string) (Record, error) {
	e, err := kv.Get(ctx, key)
	if err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return Record{}, fmt.Errorf("claim %s is not a claim record: %w", key, err)
	}
	return r, nil
}

// List reads every live claim of seat, at every scope: the holder of a
// mesh-scoped seat, or one per node of a node-scoped one.
func List(ctx context.Context, js jetstream.JetStream, seat string) ([]Record, error) {
	kv, err := js.KeyValue(ctx, mesh.ClaimsBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening the claims bucket %s: %w", mesh.ClaimsBucket(), err)
	}
	keys, err := kvsnap.New(js, kv).Keys(ctx, mesh.ClaimKeys(seat))
	if err != nil {
		return nil, fmt.Errorf("listing the claims of %s: %w", seat, err)
	}
	var out []Record
	for _, key := range keys {
		rec, err := read(ctx, kv, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // lapsed while listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// Current reads who holds seat at scope; ok is false while nobody does.
func Current(ctx context.Context, js jetstream.JetStream, seat string, scope Scope) (rec Record, ok bool, err error) {
	kv, err := js.KeyValue(ctx, mesh.ClaimsBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("opening the claims bucket %s: %w", mesh.ClaimsBucket(), err)
	}
	rec, err = read(ctx, kv, mesh.ClaimKey(seat, scope.node))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Record{}, false, nil
	}
	return rec, err == nil, err
}

// Standby claims seat at scope for holder, waiting while another holds it:
// it says so (with a logger), and takes the seat as soon as the holder
// releases it or its claim lapses. While the bus cannot be reached it keeps
// trying. It returns the Lease, or ctx's error.
func Standby(ctx context.Context, js jetstream.JetStream, seat string, scope Scope, holder string, opts ...Option) (*Lease, error) {
	o, err := makeOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := checkArgs(seat, scope, holder); err != nil {
		return nil, err
	}
	var (
		kv      jetstream.KeyValue
		seen    string
		updates <-chan jetstream.KeyValueEntry
	)
	tick := time.NewTicker(o.renew)
	defer tick.Stop()
	for {
		var l *Lease
		if kv == nil {
			kv, err = bucket(ctx, js, o)
		}
		if kv != nil {
			l, err = claim(ctx, js, kv, seat, scope, holder, o)
		}
		if err == nil {
			if seen != "" {
				o.log.Info("took the seat over", "seat", seat, "scope", scope.String(), "holder", holder)
			}
			return l, nil
		}
		var ce *ClaimedError
		if !errors.As(err, &ce) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			// The bus is away (a standby cut off, a server restarting):
			// look again at the next renewal.
			o.log.Warn("standby: claiming the seat failed; trying again", "seat", seat, "scope", scope.String(), "err", err)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-tick.C:
			}
			continue
		}
		if ce.Record.Token != seen {
			seen = ce.Record.Token
			o.log.Info("standby: the seat is held by another; taking it when that holder stops",
				"seat", seat, "scope", scope.String(), "holder", ce.Record.Holder, "since", ce.Record.Since.Format(time.RFC3339),
				"lease", ce.Record.Lease)
		}
		if updates == nil {
			var stop func()
			updates, stop = watchClaim(ctx, kv, seat, scope, o.log)
			defer stop()
		}
		if updates, err = waitForChange(ctx, tick.C, updates); err != nil {
			return nil, err
		}
	}
}

// watchClaim watches the claim of seat at scope: the server leaves a marker
// where a claim lapses, so a standby takes the seat the moment it is free.
// On failure it returns no updates (the standby's tick is the fallback) and
// a stop that does nothing.
func watchClaim(ctx context.Context, kv jetstream.KeyValue, seat string, scope Scope, log *slog.Logger) (<-chan jetstream.KeyValueEntry, func()) {
	w, err := kv.Watch(ctx, mesh.ClaimKey(seat, scope.node), jetstream.UpdatesOnly())
	if err != nil {
		log.Warn("watching the seat's claim; looking again every renewal instead", "err", err)
		return nil, func() {}
	}
	return w.Updates(), func() { _ = w.Stop() }
}

// waitForChange waits for the next tick, or for the claim to be deleted or
// to lapse, and returns the updates to watch on (nil once they closed), or
// ctx's error.
func waitForChange(ctx context.Context, tick <-chan time.Time, updates <-chan jetstream.KeyValueEntry) (<-chan jetstream.KeyValueEntry, error) {
	for {
		select {
		case <-ctx.Done():
			return updates, ctx.Err()
		case <-tick:
			return updates, nil
		case e, ok := <-updates:
			if !ok {
				return nil, nil
			}
			if e != nil && e.Operation() != jetstream.KeyValuePut {
				return updates, nil
			}
		}
	}
}

// Hold runs fn as the holder of seat at scope: it stands by while another
// holds the seat, runs fn with a context that is cancelled the moment the
// claim is lost, and after a loss stands by again (fn runs anew once the
// seat is this holder's again). It returns when ctx is done (nil) or fn
// returns while the claim is still held (fn's error); the claim is released
// either way.
func Hold(ctx context.Context, js jetstream.JetStream, seat string, scope Scope, holder string, fn func(context.Context) error, opts ...Option) error {
	o, err := makeOptions(opts)
	if err != nil {
		return err
	}
	for {
		l, err := Standby(ctx, js, seat, scope, holder, opts...)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		hctx, cancel := l.Context(ctx)
		err = fn(hctx)
		cancel()
		lost := l.Err()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), o.renew)
		if rerr := l.Release(rctx); rerr != nil {
			o.log.Warn("releasing the seat", "err", rerr)
		}
		rcancel()
		if ctx.Err() != nil {
			// Stopping: what fn said on its way out (a consumer it was
			// binding, cancelled) is not a failure.
			return nil
		}
		if errors.Is(lost, ErrLost) {
			o.log.Error("stopped working after losing the seat; standing by", "seat", seat, "scope", scope.String(), "fn_err", err)
			continue
		}
		return err
	}
}

// Process names this process as a holder, for people reading a refusal:
// "NAME on HOST pid PID".
func Process(name string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown host"
	}
	return fmt.Sprintf("%s on %s pid %d", name, host, os.Getpid())
}
