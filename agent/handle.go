package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/mesh"
)

// handle works one ask and settles it, in four steps: decode it (or refuse
// it), work it, decide its one outcome, settle that outcome.
func (a *Agent) handle(work context.Context, msg jetstream.Msg) {
	a.obs.Began()
	attempt := attemptOf(msg)
	log := a.log.With("attempt", attempt)
	ask, err := a.decode(msg.Data())
	if mesh.ValidAskID(ask.ID) {
		if !a.hand.take(ask.ID) {
			// Delivered again to this very machine while it still has the
			// ask in hand (the server's ack wait ran out in an outage, or
			// while the bus was frozen): left to that hand — its build, or
			// the settling of its outcome — which claims the ask again
			// itself. Claimed here as well, the two would share this
			// machine's key, each overwrite the other's claim, and the ask be
			// built twice.
			held := &claim.AskRecord{Ask: ask.ID, Machine: a.cfg.Machine, Holder: "this machine, which still has it in hand"}
			a.settle(work, msg, log.With("ask", ask.ID, "module", ask.Module, "plan", ask.Plan), handedBack(0, max(a.lease/2, time.Second), claimedBy(held)), nil)
			return
		}
		defer a.hand.drop(ask.ID)
	}
	var out outcome
	switch {
	case err != nil:
		out = a.refuse(msg, ask, attempt, err)
		if mesh.ValidAskID(ask.ID) && ask.Plan != "" {
			// Refused by its holder: claimed first, so that the
			// controller takes the refusal as this machine's word.
			if c, verdict, _ := a.claim(work, ask, attempt, queuedAt(msg), msg.Reply()); verdict == claimed {
				a.settle(work, msg, log, out, c)
				return
			}
		}
	default:
		log = log.With("ask", ask.ID, "module", ask.Module, "plan", ask.Plan)
		claiming := time.Now()
		c, verdict, err := a.claim(work, ask, attempt, queuedAt(msg), msg.Reply())
		debugClaim(work, log, msg, verdict, time.Since(claiming), err)
		switch verdict {
		case claimDone:
			// Its outcome was recorded (its holder lost the ack, or died
			// announcing it): announced again under the same id, not
			// built again.
			if out, ok := a.adopt(work, ask, attempt, c); ok {
				a.settle(work, msg, log, out, c)
				return
			}
			out = outcome{End: End{Outcome: OutcomeDone}, how: ack, err: fmt.Errorf("its outcome, %s, was announced on %s", c.found.Done.Outcome, c.found.Done.Machine)}
		case claimHeld:
			// Redelivered while its holder still works on it: left to it,
			// and looked at again within half a lease (a dead holder's
			// claim lapses within one).
			out = handedBack(0, max(a.lease/2, time.Second), claimedBy(c.found.Held))
		case claimFailed:
			out = handedBack(0, a.cfg.RetryDelay, err)
		default:
			if why, _ := a.health.state(); why != "" {
				// This machine cannot build: the ask is not built here,
				// but its budget is spent (pass).
				out = a.pass(ask, attempt, c, why, 0, nil)
			} else {
				out = a.work(work, msg, ask, attempt, c, log)
			}
			a.settle(work, msg, log, out, c)
			return
		}
	}
	a.settle(work, msg, log, out, nil)
}

// debugClaim writes, at debug level, what claiming an ask found and how
// long it took, with when the server queued the ask (its clock) and how
// many times it was delivered: an operator reading a slow fleet sees where
// an ask's time went between the controller and its build.
func debugClaim(ctx context.Context, log *slog.Logger, msg jetstream.Msg, v claimVerdict, took time.Duration, err error) {
	if !log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := []any{"verdict", v.String(), "took", took.Round(time.Microsecond)}
	if md, merr := msg.Metadata(); merr == nil {
		attrs = append(attrs, "queued", md.Timestamp.UTC().Format(time.RFC3339Nano), "delivered", md.NumDelivered)
	}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	log.Debug("claim", attrs...)
}

// adopt is the outcome of an ask whose outcome another holder (or this
// machine, before its acknowledgement was lost or its agent restarted)
// recorded in its claim: the same event under the id it was recorded with,
// so the stream keeps it once whether or not the first publish landed.
// Another machine's is made this machine's (on, attempt), and the ask is
// claimed for this machine first, so that the controller takes the event
// as the holder's; this machine's own is announced again as it was. ok is false for a record that carries no
// event (it is then acknowledged as announced).
func (a *Agent) adopt(ctx context.Context, ask mesh.Ask, attempt int, c *hold) (outcome, bool) {
	rec := c.found.Done
	if len(rec.Event) == 0 || rec.MsgID == "" || a.claims == nil {
		return outcome{}, false
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Event, &body); err != nil {
		return outcome{}, false
	}
	if rec.Machine != a.cfg.Machine {
		// Announced by this machine, with its own proof of delivery
		// (the recorded one is the first holder's).
		body["on"], body["attempt"], body["proof"] = a.cfg.Machine, attempt, a.proof(ask)
		l, err := a.claims.Claim(ctx, ask.ID, ask.Secret, attempt, rec.InfraSince, c.reply)
		if err != nil {
			return handedBack(0, a.cfg.RetryDelay, err), true
		}
		c.lease = l
	}
	// This machine's own record (its acknowledgement was lost, or its
	// agent restarted) is announced again as it was, for the attempt it
	// records, and its claim is left as it is: claimed again for this
	// attempt, the key would no longer vouch for the event the stream may
	// hold already (the controller refused that one, and the plan hung).
	out := outcome{End: End{Outcome: OutcomeDone}, event: rec.Outcome, id: rec.MsgID, body: body, how: ack,
		adopted: rec.Machine, err: fmt.Errorf("its outcome, %s, was recorded on %s: announced again, not built", rec.Outcome, rec.Machine)}
	if rec.Outcome == mesh.EventFailed {
		out.how, out.why = term, "failed"
	}
	return out, true
}

// proof is what this machine's outcomes of ask carry to show it was
// delivered the ask (mesh.AskProof).
func (a *Agent) proof(ask mesh.Ask) string { return mesh.AskProof(ask.Secret, ask.ID, a.cfg.Machine) }

// attemptOf is the ask's delivery count: 1 the first time.
// queuedAt is when the server stored msg (its clock); zero if unknown.
func queuedAt(msg jetstream.Msg) time.Time {
	if md, err := msg.Metadata(); err == nil {
		return md.Timestamp
	}
	return time.Time{}
}

func attemptOf(msg jetstream.Msg) int {
	if md, err := msg.Metadata(); err == nil {
		return int(md.NumDelivered)
	}
	return 1
}

// decode reads an ask and checks that this catalogue builds its module.
func (a *Agent) decode(data []byte) (mesh.Ask, error) {
	ask, err := mesh.DecodeAsk(data)
	if err == nil && a.cfg.Known != nil && !a.cfg.Known(ask.Module) {
		err = fmt.Errorf("%w: module %q is not built by this catalogue", mesh.ErrMalformedAsk, ask.Module)
	}
	return ask, err
}

// refuse is the outcome of an ask that cannot be read: failed{ask} once,
// never redelivered. Its id may be missing or wrong: the failed is
// deduplicated by the ask's place in the queue instead.
func (a *Agent) refuse(msg jetstream.Msg, ask mesh.Ask, attempt int, err error) outcome {
	dedupe := fmt.Sprintf("malformed-%d", attempt)
	if md, merr := msg.Metadata(); merr == nil {
		dedupe = fmt.Sprintf("malformed-%s-%d", md.Stream, md.Sequence.Stream)
	}
	out := a.failed(ask, attempt, mesh.ReasonAsk, dedupe, 0, err, nil)
	out.why = "malformed ask"
	return out
}

// work builds one ask, announcing started and heartbeating while it works,
// and returns its outcome.
func (a *Agent) work(ctx context.Context, msg jetstream.Msg, ask mesh.Ask, attempt int, c *hold, log *slog.Logger) outcome {
	a.inFlight.Add(1)
	defer a.inFlight.Add(-1)
	begun := time.Now()
	// started goes out beside the build, not before it: the build does
	// not wait a round trip of the bus (on a cluster, a replicated write);
	// and only once the build has gone on for Config.StartedDelay: one
	// that ends sooner (a cached rebuild) announces only its outcome.
	// An outcome is announced only once a started sent has been published
	// (reported), so that the stream still holds started first.
	reported := a.reportAfter(ctx, a.cfg.StartedDelay, mesh.EventStarted, fmt.Sprintf("%s-started-%d", ask.ID, attempt), mesh.Started{
		Version: mesh.AskVersion, Ask: ask.ID, Plan: ask.Plan, Module: ask.Module,
		On: a.cfg.Machine, Attempt: attempt, At: begun.UTC(), Proof: a.proof(ask),
	})
	defer reported()

	held, release := a.holdContext(ctx, ask, attempt, c)
	defer release()
	buildCtx, stop := a.running.start(held, ask.ID)
	if d := a.cfg.BuildTimeout; d > 0 {
		timer := time.AfterFunc(d, func() {
			a.running.stopWith(ask.ID, fmt.Errorf("%w: the build was still going after --build-timeout %s, and was stopped", ErrTimedOut, d))
		})
		defer timer.Stop()
	}
	watching := a.watchBuilder(buildCtx, ask.ID)
	beating := a.heartbeat(ctx, msg, log)
	logs := newLogBatcher(a.publishLog, ask.ID, a.cfg.LogBatchLines, a.cfg.LogFlush, a.cfg.FailedLogLines)
	res, err := a.worker.Work(buildCtx, ask, logs.Line)
	watching()
	cause := stop() // from here a cancel no longer reaches this build
	logs.Close()
	took := time.Since(begun)
	// A started due is stored before the claim is looked at: its publish
	// may have retried through a bus outage, long enough for the claim to
	// lapse (then taken again below, or the ask given back). Meanwhile the
	// delivery is still heartbeaten and a lapsed claim claimed again as
	// soon as the bus answers (holdContext's watch): stopped at the build's
	// end, the ask went to another machine while this one waited out the
	// started's retries, and was built twice (fresh-clone CI, a cluster
	// without quorum for a few seconds).
	reported()
	beating()
	release() // its claim as the watch left it (holdContext)

	if lerr := c.lost(); lerr != nil {
		// Cut off or stalled for a lease: claimed again if nobody took
		// the ask since, else it is another machine's now, and nothing is
		// announced (the controller would refuse it).
		if !errors.Is(lerr, claim.ErrLapsed) || a.retake(ctx, ask, attempt, c) != nil {
			return outcome{End: End{Outcome: OutcomeHandedBack, Took: took}, how: nak, err: fmt.Errorf("not announced: %w", lerr), lost: true}
		}
	}
	switch {
	case errors.Is(cause, errBuilderGone) && err != nil:
		// The machine's builder stopped answering: the machine is sick,
		// and the ask goes back at once for another (its budget spent
		// as for any failure of the machine).
		a.sick(cause)
		return a.pass(ask, attempt, c, oneLine(cause), took, nil)
	case errors.Is(cause, ErrTimedOut) && err != nil:
		// Its own doing, as a RUN that fails: failed once, not retried.
		return a.failed(ask, attempt, mesh.ReasonBuild, ask.ID+"-failed", took, cause, logs.Tail())
	case errors.Is(cause, ErrCancelled):
		// Even a build that finished as the cancel came is not announced
		// built: the plan no longer wants it.
		if err == nil {
			err = fmt.Errorf("%w: the build finished as it was cancelled and is not announced", ErrCancelled)
		}
		return a.failed(ask, attempt, mesh.ReasonCancel, ask.ID+"-failed", took, err, logs.Tail())
	case err != nil && errors.Is(cause, ErrStopped):
		return handedBack(took, 0, ErrStopped)
	case err == nil:
		// What is left is the bus's: announcing and acknowledging it. The
		// slot may pull its next ask meanwhile (Config.Overlap), as it
		// does beside an export.
		StepsDone(ctx)
		return a.built(ask, attempt, res, took)
	}
	reason := Classify(err)
	if reason == mesh.ReasonInfra {
		if c.infraSince.IsZero() {
			c.infraSince = begun // kept in the claim when it is released
			if md, merr := msg.Metadata(); c.lease == nil && merr == nil {
				// No claims to keep it across deliveries: count from
				// when the ask was queued.
				c.infraSince = md.Timestamp
			}
		}
		if perr := a.probe(ctx); perr != nil {
			// The machine's failure, not only the ask's: it goes back at
			// once (its budget spent all the same), and this machine
			// stops pulling.
			a.sick(perr)
			return a.pass(ask, attempt, c, oneLine(perr), took, err)
		}
		if spent := time.Since(c.infraSince); spent < a.cfg.RetryFor {
			delay := a.cfg.retryDelay(attempt)
			return outcome{End: End{Outcome: OutcomeRetried, Reason: reason, Took: took}, how: nak, delay: delay, err: err,
				back: a.handedBackNote(ask, attempt, strings.TrimPrefix(oneLine(err), mesh.ReasonInfra+": "), c.infraSince, time.Now().Add(delay), false)}
		}
		err = fmt.Errorf("%w (failing on infrastructure since %s, more than --retry-for %s)", err, c.infraSince.UTC().Format(time.RFC3339), a.cfg.RetryFor)
	}
	return a.failed(ask, attempt, reason, ask.ID+"-failed", took, err, logs.Tail())
}

// pass is the outcome of an ask on a machine that cannot build (why, its
// probe's words; err the ask's own failure here, if it was tried): its
// budget runs from its first infrastructure failure on any machine (the
// claims' earliest InfraSince), else from now. Spent, the ask is
// failed{infra}, "no healthy machine"; else it is handed back at once,
// recording the budget and why in its claim, so that a healthy machine
// takes it, and whichever machine takes it next spends the same budget.
func (a *Agent) pass(ask mesh.Ask, attempt int, c *hold, why string, took time.Duration, err error) outcome {
	why = strings.TrimPrefix(why, mesh.ReasonInfra+": ") // the probe's words, not its class
	if c.infraSince.IsZero() {
		c.infraSince = time.Now()
	}
	if time.Since(c.infraSince) >= a.cfg.RetryFor {
		ferr := fmt.Errorf("no healthy machine: %s (since %s), more than --retry-for %s", why, c.infraSince.UTC().Format(time.RFC3339), a.cfg.RetryFor)
		if err != nil {
			ferr = fmt.Errorf("%w; here: %s", ferr, oneLine(err))
		}
		return a.failed(ask, attempt, mesh.ReasonInfra, ask.ID+"-failed", took, ferr, nil)
	}
	cause := fmt.Errorf("this machine cannot build (%s)", why)
	if err != nil {
		cause = fmt.Errorf("%w: %w", cause, err)
	}
	out := handedBack(took, 0, cause)
	out.back = a.handedBackNote(ask, attempt, why, c.infraSince, time.Time{}, true)
	return out
}

// handedBackNote is the handed-back event of an ask given back for why,
// due again at next (zero: at once).
func (a *Agent) handedBackNote(ask mesh.Ask, attempt int, why string, infraSince, next time.Time, sick bool) *mesh.HandedBack {
	hb := &mesh.HandedBack{Version: mesh.AskVersion, Ask: ask.ID, Plan: ask.Plan, Module: ask.Module, On: a.cfg.Machine,
		Attempt: attempt, Why: why, Sick: sick, At: time.Now().UTC(), Proof: a.proof(ask)}
	if !infraSince.IsZero() {
		hb.InfraSince = infraSince.UTC()
	}
	if !next.IsZero() {
		hb.Next = next.UTC()
	}
	return hb
}

// heartbeat tells the server every a.beat that the ask is still being
// worked on (InProgress), until the returned func is called. (The ask's
// claim renews itself: claim.AskLease.)
func (a *Agent) heartbeat(ctx context.Context, msg jetstream.Msg, log *slog.Logger) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		beat := time.NewTicker(a.beat)
		defer beat.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-beat.C:
				if err := msg.InProgress(); err != nil {
					log.Warn("heartbeat failed", "err", err)
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

// heartbeatEvery is how often a slot heartbeats: every, when set, else a
// third of the consumer's ack wait (HeartbeatShare), so that two beats may
// be lost before the server gives the ask to another holder.
func heartbeatEvery(every, ackWait time.Duration) time.Duration {
	if every > 0 {
		return every
	}
	if ackWait <= 0 {
		ackWait = mesh.HolderAckWait
	}
	return ackWait / HeartbeatShare
}

// HeartbeatShare is the default heartbeat as a share of the ack wait: with
// the holders' 8 s ack wait (mesh.HolderAckWait), every 2.7 s.
const HeartbeatShare = 3

// ErrStopped is the cause given to a build cut short because its agent is
// stopping; its ask is handed back, not failed.
var ErrStopped = errors.New("agent stopping")

// ErrCancelled is the cause given to a build whose plan was cancelled.
var ErrCancelled = errors.New("plan cancelled")

// ErrTimedOut is the cause of a build stopped at Config.BuildTimeout.
var ErrTimedOut = errors.New("build timed out")

// Cancel cuts short the build of ask id on this agent, if it is working on
// it, and reports whether it was. A build cancelled is failed{cancelled}
// and settled; it is never announced built, even if it finished as the
// cancel came. Once Cancel has returned false for a build, its outcome is
// the build's own.
func (a *Agent) Cancel(id string) bool { return a.running.cancel(id) }
