package cascade

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

// The fence (issue 19): the controller checks before it trusts. An outcome
// of the build seat (started, built, failed), and its note handed-back,
// counts only
//
//   - from a machine the ask was delivered to: it carries the proof
//     (mesh.AskProof) only the ask's secret makes, which the controller
//     derives (askSecret) and only the ask's deliveries carry — a machine
//     that predicts an ask's id (they are derived from the plan) and
//     claims it under its own key is refused;
//   - from the machine its subject names (the server pins that token to the
//     machine's own credentials: mesh.HolderEventSubject), speaking of
//     itself (the event's "on" is that machine);
//   - from the holder of the ask: that machine's claim of the ask
//     (claim.ReadAsk) exists, is for the event's attempt, and, once
//     settled, settled with this outcome (a handed-back: settled as
//     released);
//   - for the ask's current attempt: none older than an attempt whose start
//     the controller has seen;
//   - and, for built, once its digest resolves in the registry, in the
//     module's own repository, as an image manifest or index;
//   - and, for an ask the controller saw start on another machine, once
//     that machine has let the ask go (taken): its claim lapsed, was
//     handed back, or is void because its seat claim lapsed. A claim of
//     the machine's own is not enough: every machine may write its own
//     claim of any ask, and one that did so while another built the ask
//     would otherwise take it over in flight, with a digest of its choice.
//
// Anything else is refused: counted by reason, logged with the machine and
// the reason, and it changes nothing — no plan, input key, current image
// or machine list. A refused event is settled (Term), so it is never
// redelivered; the genuine outcome, published under the holder's own
// message id, still lands.

// Reasons an outcome is refused (meshbuild_controller_refused_events_total).
const (
	RefusedSubject    = "subject"    // not on a holder's subject
	RefusedSpeaker    = "speaker"    // its "on" names another machine than its subject
	RefusedUnclaimed  = "unclaimed"  // the machine holds no claim of the ask
	RefusedAttempt    = "attempt"    // not the attempt the machine's claim records
	RefusedStale      = "stale"      // an attempt older than one already started
	RefusedOutcome    = "outcome"    // the claim was settled with another outcome
	RefusedUnresolved = "unresolved" // a built digest the registry does not hold
	RefusedNotImage   = "not-image"  // a built digest that is not an image manifest or index
	RefusedMalformed  = "malformed"  // an event that cannot be read
	RefusedHeld       = "held"       // an ask another machine still holds: the one the controller saw start it
	RefusedProof      = "proof"      // no proof the machine was delivered the ask (mesh.AskProof)
)

// RefusedReasons are every reason, for metrics to pre-initialise.
var RefusedReasons = []string{RefusedSubject, RefusedSpeaker, RefusedUnclaimed, RefusedAttempt, RefusedStale,
	RefusedOutcome, RefusedUnresolved, RefusedNotImage, RefusedMalformed, RefusedHeld, RefusedProof}

// RefusedObserver is told of every event the controller refuses, by
// reason. An Observer that implements it is told.
type RefusedObserver interface {
	RefusedEvent(reason string)
}

// ImageChecker tells whether a digest names an image the registry holds in
// a repository. CheckImage returns nil for an image manifest or index, an
// error matching ErrNoImage when the registry answers that it holds no such
// manifest there (or holds something else), and any other error when the
// registry could not be asked (the event is then looked at again later).
type ImageChecker interface {
	CheckImage(ctx context.Context, repo, digest string) error
}

// ErrNoImage is matched by an ImageChecker's answer that the registry does
// not hold the image.
var ErrNoImage = errors.New("no such image")

// registryImages checks images with a registry client: a HEAD of
// repo@digest.
type registryImages struct{ c *registry.Client }

func (r registryImages) CheckImage(ctx context.Context, repo, digest string) error {
	desc, err := r.c.Head(ctx, repo+"@"+digest)
	var terr *transport.Error
	switch {
	case errors.As(err, &terr) && (terr.StatusCode == http.StatusNotFound || terr.StatusCode == http.StatusBadRequest):
		return fmt.Errorf("%w: %s@%s: %v", ErrNoImage, repo, digest, err)
	case err != nil:
		return err
	case !desc.MediaType.IsImage() && !desc.MediaType.IsIndex():
		return fmt.Errorf("%w: %s@%s is a %s, not an image manifest or index", ErrNoImage, repo, digest, desc.MediaType)
	case desc.Digest.String() != digest:
		return fmt.Errorf("%w: %s@%s resolves to %s", ErrNoImage, repo, digest, desc.Digest)
	}
	return nil
}

// verdict is the fence's answer on one event: nil to apply it; refused
// with a reason; or retry (the registry or the bus could not be asked).
type verdict struct {
	reason string
	err    error
	retry  bool
	// o is the outcome read, for an event let through (taken reads it).
	o outcomeOf
}

// through reports whether the verdict lets the event through.
func (v *verdict) through() bool { return v == nil || (!v.retry && v.reason == "") }

// fenceLooks is how many deliveries of an event the fence looks for a claim
// it does not find before it refuses the event.
const fenceLooks = 3

// fenceTimeout bounds the checks of one event.
const fenceTimeout = 10 * time.Second

// fenceParallel bounds the checks made at once for a batch: their claim
// reads are the bus's. At 32, a batch of 400 events (a tier ending on a
// thousand machines) took 60 ms to fence on three servers, and its
// outcomes waited for it.
const fenceParallel = 256

// fenceRegistryParallel bounds the registry lookups made at once for a
// batch (one per built).
const fenceRegistryParallel = 32

// outcomeOf reads a build seat outcome's fields the fence checks: the ask,
// the machine it claims to be on, its attempt, and for built its module
// and digest.
type outcomeOf struct {
	event, plan, ask, on, module, digest, proof string
	attempt                                     int
	// decoded is the event as read (a mesh.Started, Built, Failed or
	// HandedBack): applied as it is, not decoded again.
	decoded any
}

// fence checks the outcomes in a batch at once (in parallel: each takes a
// read of the claims bucket, a built a registry request too) and returns
// their verdicts by message; messages that are not outcomes have none.
// The events of one machine for one ask in the batch (a short build's
// started and built) share one read of its claim: made once all of them
// were published, it is what each would have read.
func (c *Controller) fence(ctx context.Context, batch []jetstream.Msg) map[jetstream.Msg]*verdict {
	out := map[jetstream.Msg]*verdict{}
	var mu sync.Mutex
	reads := &claimReads{m: map[string]*claimRead{}, registry: make(chan struct{}, fenceRegistryParallel)}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fenceParallel)
	for _, m := range batch {
		if _, _, _, ok := mesh.SplitHolderEventSubject(m.Subject()); !ok {
			continue
		}
		g.Go(func() error {
			v := c.check(gctx, m, reads)
			mu.Lock()
			out[m] = v
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	return out
}

// claimReads are the claim reads of one batch's fence, by ask and machine.
type claimReads struct {
	mu sync.Mutex
	m  map[string]*claimRead
	// registry bounds the batch's registry lookups (fenceRegistryParallel).
	registry chan struct{}
}

type claimRead struct {
	once sync.Once
	rec  claim.AskRecord
	ok   bool
	err  error
}

// readClaim is claim.ReadAsk of machine's claim of ask, made once for the batch.
func (c *Controller) readClaim(ctx context.Context, reads *claimReads, ask, machine string) (claim.AskRecord, bool, error) {
	if reads == nil {
		return claim.ReadAsk(ctx, c.js, c.asks, ask, machine)
	}
	key := mesh.AskClaimKey(ask, machine)
	reads.mu.Lock()
	r := reads.m[key]
	if r == nil {
		r = &claimRead{}
		reads.m[key] = r
	}
	reads.mu.Unlock()
	r.once.Do(func() { r.rec, r.ok, r.err = claim.ReadAsk(ctx, c.js, c.asks, ask, machine) })
	return r.rec, r.ok, r.err
}

// check is the fence's verdict on one holder's event: refused, to be
// looked at again (retry), or through, with the outcome it read. The
// machine's claim is read through reads (nil: a read of its own).
func (c *Controller) check(ctx context.Context, m jetstream.Msg, reads *claimReads) *verdict {
	ctx, cancel := context.WithTimeout(ctx, fenceTimeout)
	defer cancel()
	seat, machine, event, _ := mesh.SplitHolderEventSubject(m.Subject())
	if seat != mesh.BuildSeat {
		return &verdict{reason: RefusedSubject, err: fmt.Errorf("seat %s is not the build seat", seat)}
	}
	o, err := readOutcome(event, m.Data())
	if err != nil {
		return &verdict{reason: RefusedMalformed, err: err}
	}
	if o.on != machine {
		return &verdict{reason: RefusedSpeaker, err: fmt.Errorf("it says it is on %q, and was published by machine %s", o.on, machine)}
	}
	if c.asks == nil {
		return &verdict{reason: RefusedUnclaimed, err: errors.New("the ask claims bucket is not open")}
	}
	rec, ok, err := c.readClaim(ctx, reads, o.ask, machine)
	// ReadAsk asks the bucket's leader for a claim a replica does not show;
	// a claim not found (or of an older attempt) is still looked for again
	// on the event's next deliveries before the event is refused: a claim
	// settled as the cluster came back can be removed by the server's
	// marker of its lease's end and written again by its holder
	// (claim.AskLease).
	early := false
	if md, merr := m.Metadata(); merr == nil && md.NumDelivered < fenceLooks {
		early = true
	}
	switch {
	case err != nil:
		return &verdict{retry: true, err: fmt.Errorf("reading the claim of ask %s on %s: %w", o.ask, machine, err)}
	case !ok && early, ok && rec.Attempt < o.attempt && early:
		return &verdict{retry: true, err: fmt.Errorf("machine %s's claim of ask %s for attempt %d is not there (yet)", machine, o.ask, o.attempt)}
	case !ok:
		return &verdict{reason: RefusedUnclaimed, err: fmt.Errorf("machine %s holds no claim of ask %s", machine, o.ask)}
	case rec.Attempt != o.attempt:
		return &verdict{reason: RefusedAttempt, err: fmt.Errorf("machine %s claimed ask %s for attempt %d, not %d", machine, o.ask, rec.Attempt, o.attempt)}
	case rec.Outcome != "" && event != mesh.EventStarted && rec.Outcome != event:
		return &verdict{reason: RefusedOutcome, err: fmt.Errorf("machine %s settled ask %s as %s", machine, o.ask, rec.Outcome)}
	case event == mesh.EventHandedBack && rec.Released == "":
		return &verdict{reason: RefusedOutcome, err: fmt.Errorf("machine %s says it handed ask %s back, and its claim is not released", machine, o.ask)}
	}
	if !mesh.ValidAskProof(o.proof, c.askSecret(o.ask), o.ask, machine) {
		return &verdict{reason: RefusedProof, err: fmt.Errorf("machine %s shows no proof it was delivered ask %s", machine, o.ask)}
	}
	if event != mesh.EventBuilt {
		return &verdict{o: o}
	}
	if reads != nil && reads.registry != nil {
		select {
		case reads.registry <- struct{}{}:
		case <-ctx.Done():
			return &verdict{retry: true, err: fmt.Errorf("resolving %s@%s: %w", c.Image(o.module), o.digest, ctx.Err())}
		}
		defer func() { <-reads.registry }()
	}
	err = c.cfg.Images.CheckImage(ctx, c.Image(o.module), o.digest)
	switch {
	case errors.Is(err, ErrNoImage):
		return &verdict{reason: RefusedUnresolved, err: err}
	case err != nil:
		return &verdict{retry: true, err: fmt.Errorf("resolving %s@%s: %w", c.Image(o.module), o.digest, err)}
	}
	return &verdict{o: o}
}

// taken is the fence's look at an outcome of an ask the plan saw start on
// another machine (State.HolderOf), made in order as the batch is applied,
// with the plan as its earlier events left it. It counts only once that
// machine has let the ask go: its claim lapsed (the server removed it),
// was released (handed back), or is void (its seat claim lapsed: it is no
// longer bound). A claim that machine settled counts against every other
// outcome but one: the same outcome (for built, the same digest) announced
// again by the machine that adopted it (the agent's adopt: the holder died
// between recording its outcome and announcing it). While the other
// machine holds the ask the event is looked at again on its next
// deliveries (a replica may lag the lapse a moment), then refused.
func (c *Controller) taken(ctx context.Context, m jetstream.Msg, event string, o outcomeOf) *verdict {
	if c.asks == nil {
		return nil
	}
	st := c.plans[o.plan]
	if st == nil {
		return nil
	}
	holder := st.HolderOf(o.plan, o.module, o.ask)
	if holder == "" || holder == o.on {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, fenceTimeout)
	defer cancel()
	rec, ok, err := claim.ReadAsk(ctx, c.js, c.asks, o.ask, holder)
	switch {
	case err != nil:
		return &verdict{retry: true, err: fmt.Errorf("reading the claim of ask %s on %s: %w", o.ask, holder, err)}
	case !ok || rec.Released != "":
		return nil // it lapsed, or was handed back
	case rec.Outcome != "":
		if rec.Outcome == event && (event != mesh.EventBuilt || recordedDigest(rec) == o.digest) {
			return nil // its own outcome, adopted
		}
		return &verdict{reason: RefusedHeld, err: fmt.Errorf("ask %s was started on %s, which settled it as %s; %s says %s", o.ask, holder, rec.Outcome, o.on, event)}
	case !claim.Bound(ctx, c.seatClaims, mesh.BuildSeat, rec):
		return nil // its machine's seat lapsed: the claim is void
	}
	v := &verdict{reason: RefusedHeld, err: fmt.Errorf("ask %s was started on %s, which still holds it; %s says %s", o.ask, holder, o.on, event)}
	if md, err := m.Metadata(); err == nil && md.NumDelivered < fenceLooks {
		v.reason, v.retry = "", true
	}
	return v
}

// recordedDigest is the digest of the built event a settled claim records.
func recordedDigest(rec claim.AskRecord) string {
	ev, err := mesh.DecodeEvent[mesh.Built](rec.Event)
	if err != nil {
		return ""
	}
	return ev.Digest
}

// askSecret is ask id's secret (mesh.Ask.Secret), derived from the
// controller's key: an HMAC-SHA256 of the id, in hex.
func (c *Controller) askSecret(id string) string {
	h := hmac.New(sha256.New, c.askKey)
	h.Write([]byte("ask\x00"))
	h.Write([]byte(id))
	return hex.EncodeToString(h.Sum(nil))
}

// readOutcome reads what the fence checks of an outcome event.
func readOutcome(event string, data []byte) (outcomeOf, error) {
	switch event {
	case mesh.EventStarted:
		ev, err := mesh.DecodeEvent[mesh.Started](data)
		return outcomeOf{event: event, plan: ev.Plan, ask: ev.Ask, on: ev.On, module: ev.Module, attempt: ev.Attempt, proof: ev.Proof, decoded: ev}, err
	case mesh.EventBuilt:
		ev, err := mesh.DecodeEvent[mesh.Built](data)
		if err == nil && !strings.HasPrefix(ev.Digest, "sha256:") {
			err = fmt.Errorf("%w: built digest %q", mesh.ErrMalformedEvent, ev.Digest)
		}
		return outcomeOf{event: event, plan: ev.Plan, ask: ev.Ask, on: ev.On, module: ev.Module, digest: ev.Digest, attempt: ev.Attempt, proof: ev.Proof, decoded: ev}, err
	case mesh.EventFailed:
		ev, err := mesh.DecodeEvent[mesh.Failed](data)
		return outcomeOf{event: event, plan: ev.Plan, ask: ev.Ask, on: ev.On, module: ev.Module, attempt: ev.Attempt, proof: ev.Proof, decoded: ev}, err
	case mesh.EventHandedBack:
		ev, err := mesh.DecodeEvent[mesh.HandedBack](data)
		return outcomeOf{event: event, plan: ev.Plan, ask: ev.Ask, on: ev.On, module: ev.Module, attempt: ev.Attempt, proof: ev.Proof, decoded: ev}, err
	}
	return outcomeOf{}, fmt.Errorf("%w: the build seat has no event %q", mesh.ErrMalformedEvent, event)
}

// refuse settles a refused event: counted, logged with the machine and the
// reason, terminated so it is never redelivered.
func (c *Controller) refuse(m jetstream.Msg, v *verdict) {
	_, machine, _, _ := mesh.SplitHolderEventSubject(m.Subject())
	if ro, ok := c.obs.(RefusedObserver); ok {
		ro.RefusedEvent(v.reason)
	}
	c.log.Warn("refused an event: it changes nothing", "machine", machine, "subject", m.Subject(), "reason", v.reason, "err", v.err)
	_ = m.Term()
}

// stale reports whether an outcome's attempt is older than one whose start
// the controller has applied: a machine that lost the ask speaking late.
func (c *Controller) stale(ask string, attempt int) bool {
	return attempt < c.attempts[ask]
}
