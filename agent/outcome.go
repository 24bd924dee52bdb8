package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
)

// Outcome names how an agent finished with an ask: what it announced and
// how it settled the ask. These are the names metrics count by.
type Outcome string

const (
	// OutcomeBuilt: built, pushed, announced built and acknowledged.
	OutcomeBuilt Outcome = mesh.EventBuilt
	// OutcomeFailed: announced failed with a reason and terminated (never
	// redelivered).
	OutcomeFailed Outcome = mesh.EventFailed
	// OutcomeRetried: an infrastructure failure; the ask was given back to
	// be tried again after a delay (Config.RetryDelay, doubling).
	OutcomeRetried Outcome = "retried"
	// OutcomeHandedBack: the ask went back to the queue unworked or
	// unfinished — the agent is stopping, cannot build the ask's platform,
	// or could not announce what it did.
	OutcomeHandedBack Outcome = "handed-back"
	// OutcomeDone: the ask came again after its outcome was announced
	// (its claim says so) and was acknowledged without building.
	OutcomeDone Outcome = "already-done"
)

// Outcomes are every Outcome, in the order above.
var Outcomes = []Outcome{OutcomeBuilt, OutcomeFailed, OutcomeRetried, OutcomeHandedBack, OutcomeDone}

// End is how one ask ended, as an Observer is told.
type End struct {
	Outcome Outcome
	// Reason is the failure class (mesh.Reason*) of a failed or retried
	// ask; empty otherwise.
	Reason string
	// Took is how long the agent worked on the ask; zero for an ask
	// refused or handed back before any work.
	Took time.Duration
	// Bytes and CacheHits are the built image's size in the registry and
	// the build steps answered from cache; zero unless built.
	Bytes     int64
	CacheHits int
}

// Observer is told what the agent does, for metrics. Every method must be
// safe for concurrent use and quick. Every Began is followed by one Ended.
type Observer interface {
	IdleWaited(d time.Duration)
	Began()
	Ended(End)
}

type nopObserver struct{}

func (nopObserver) IdleWaited(time.Duration) {}
func (nopObserver) Began()                   {}
func (nopObserver) Ended(End)                {}

// settlement is what is done with an ask's message once its outcome is
// announced.
type settlement int

const (
	ack  settlement = iota // Ack (not waited for): done
	term                   // TermWithReason: done, never redeliver
	nak                    // NakWithDelay: deliver again after the delay (0: at once)
)

func (s settlement) String() string {
	switch s {
	case ack:
		return "acknowledged"
	case term:
		return "terminated"
	case nak:
		return "given back"
	}
	return fmt.Sprintf("settlement(%d)", int(s))
}

// outcome is one ask's end, decided before anything is done about it: the
// event to announce (if any), how to settle the ask, and what to count.
// settle carries it out.
type outcome struct {
	End
	event string // the seat's event announced first; "" announces nothing
	id    string // the event's Nats-Msg-Id
	body  any    // the event's payload

	how   settlement
	delay time.Duration // before a nak'd ask is delivered again
	why   string        // a terminated ask's reason on the server; default Reason
	err   error         // why it failed, retried or went back; logged

	record *mesh.BuildRecord // the machine's record of the build, kept once settled; nil for none
	lost   bool              // the ask's claim was lost: nothing is written to it
	// adopted is the machine whose announced outcome this one announces
	// again (under its message id, in id); empty for this machine's own.
	adopted string
	// back is the handed-back event announced once the ask's claim is
	// settled as released (a retry, or a sick machine's hand-back); nil
	// announces none.
	back *mesh.HandedBack
}

// handedBack gives an ask back to the queue after delay, for err.
func handedBack(took, delay time.Duration, err error) outcome {
	return outcome{End: End{Outcome: OutcomeHandedBack, Took: took}, how: nak, delay: delay, err: err}
}

// built is the outcome of a pushed image: the one place a Result becomes
// the built event.
func (a *Agent) built(ask mesh.Ask, attempt int, res Result, took time.Duration) outcome {
	commit := res.Commit
	if commit == "" {
		commit = ask.Source.Commit
	}
	at := time.Now().UTC()
	rec := a.record(ask, mesh.EventBuilt, took, at)
	rec.Digest, rec.Commit = res.Digest, commit
	return outcome{
		End:   End{Outcome: OutcomeBuilt, Took: took, Bytes: res.Bytes, CacheHits: res.CacheHits},
		event: mesh.EventBuilt, id: ask.ID + "-built",
		body: mesh.Built{
			Version: mesh.AskVersion, Ask: ask.ID, Plan: ask.Plan, Module: ask.Module,
			Commit: commit, Digest: res.Digest, Image: res.Ref, On: a.cfg.Machine, Attempt: attempt,
			Duration: took, Bytes: res.Bytes, CacheHits: res.CacheHits, Steps: res.Steps, At: at,
			Attestations: res.Attestations, Proof: a.proof(ask),
		},
		how: ack, record: rec,
	}
}

// failed is the outcome of an ask that failed for reason: announced with the
// last lines of its log and terminated. dedupe is the event's id.
func (a *Agent) failed(ask mesh.Ask, attempt int, reason, dedupe string, took time.Duration, err error, log []string) outcome {
	at := time.Now().UTC()
	var rec *mesh.BuildRecord
	if reason != mesh.ReasonAsk { // an ask refused unread was not built here
		rec = a.record(ask, mesh.EventFailed, took, at)
		rec.Reason = reason
	}
	return outcome{
		End:   End{Outcome: OutcomeFailed, Reason: reason, Took: took},
		event: mesh.EventFailed, id: dedupe,
		body: mesh.Failed{
			Version: mesh.AskVersion, Ask: ask.ID, Plan: ask.Plan, Module: ask.Module, On: a.cfg.Machine,
			Reason: reason, Message: oneLine(err), Log: log, Attempt: attempt, At: at, Proof: a.proof(ask),
		},
		how: term, err: err, record: rec,
	}
}

// settle carries an outcome out: record it in the ask's claim (c, nil for
// an ask not claimed here) with its message id, announce it, then settle
// the ask, then count and log. An outcome that could not be recorded or
// announced is not settled — the ask is handed back instead, and whoever
// takes it next announces the recorded outcome under the same id — so
// nothing acknowledged is ever unannounced, and nothing announced is built
// again.
func (a *Agent) settle(ctx context.Context, msg jetstream.Msg, log *slog.Logger, out outcome, c *hold) {
	switch {
	case out.event != "":
		announcing := time.Now()
		if err := a.announce(ctx, out, c); err != nil {
			log.Error(string(out.Outcome)+" but not announced: giving the ask back", "err", err)
			out = handedBack(out.Took, a.cfg.RetryDelay, err)
			out.lost = true // the claim keeps the outcome for the next holder
		} else {
			// Recorded in its claim, then published and stored.
			log.Debug("announced", "event", out.event, "took", time.Since(announcing).Round(time.Microsecond))
		}
	case c != nil && !out.lost:
		why := ""
		if out.err != nil {
			why = oneLine(out.err)
		}
		if err := c.settle(ctx, "", why); err != nil {
			log.Warn("settling the ask's claim", "err", err)
		} else if out.back != nil && c.lease != nil {
			a.tellHandedBack(ctx, log, *out.back)
		}
	}
	var err error
	switch out.how {
	case ack:
		// Acknowledged even when the grace has just run out: what was
		// announced is settled, not built again elsewhere. Not waited for:
		// the ack goes ahead of this slot's next pull on the same
		// connection, and one the server never got (the connection lost)
		// brings the ask back after the ack wait to a holder that finds
		// its outcome in the claim and announces it again under the same
		// id (adopt), not built twice. Waiting cost each build a round to
		// the consumer's leader (on a cluster, a replicated one).
		err = msg.Ack()
	case term:
		why := out.why
		if why == "" {
			why = out.Reason
		}
		err = msg.TermWithReason(why)
	case nak:
		if out.delay > 0 {
			err = msg.NakWithDelay(out.delay)
		} else {
			err = msg.Nak()
		}
	}
	if err != nil {
		log.Warn("settling an ask failed; it will be redelivered after the ack wait", "outcome", out.Outcome, "err", err)
	} else {
		log.Debug("settled with the server", "how", out.how.String(), "delay", out.delay)
	}
	if out.how != nak {
		a.keep(ctx, log, out.record)
	}
	switch out.Outcome {
	case OutcomeBuilt:
		a.builtN.Add(1)
		a.failRun.Store(0)
		log.Info("built", "digest", out.body.(mesh.Built).Digest, "took", out.Took.Round(time.Millisecond))
	case OutcomeFailed:
		a.failedN.Add(1)
		log.Warn("failed", "reason", out.Reason, "err", out.err)
	case OutcomeRetried:
		log.Warn("infrastructure failure; retrying later", "err", out.err, "delay", out.delay, "for at most", a.cfg.RetryFor)
		a.coolOff(ctx, msg, out.delay, log)
	case OutcomeHandedBack:
		log.Info("handed the ask back", "after", out.Took.Round(time.Millisecond), "why", out.err)
	case OutcomeDone:
		log.Info("settled without building", "why", out.err)
	}
	a.obs.Ended(out.End)
}

// announce records out's event in the ask's claim, under a message id of
// its own (an adopted outcome keeps the id it was recorded with), then
// publishes it. A publish the stream takes as a duplicate is read back: a
// duplicate of this machine's own event, or of the machine's whose outcome
// it adopts, is this event; one another principal published first under
// the id (to have the genuine event dropped) is not, and the event is
// published again under a fresh id.
func (a *Agent) announce(ctx context.Context, out outcome, c *hold) error {
	data, err := json.Marshal(out.body)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", out.event, err)
	}
	id := out.id
	if out.adopted == "" {
		id += "-" + rand.Text()[:16]
	}
	if c != nil && c.lease != nil {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), retakeFor)
		err := c.lease.Announce(actx, out.event, id, data)
		cancel()
		if err != nil {
			return fmt.Errorf("recording %s in the ask's claim: %w", out.event, err)
		}
	}
	for range 2 {
		ack, err := a.publish(ctx, out.event, id, data)
		if err != nil {
			return err
		}
		if !ack.Duplicate || a.ours(ctx, ack.Sequence, out.adopted, askOf(out.body), id) {
			return nil
		}
		a.log.Warn("the stream took this outcome as a duplicate of another principal's event: announcing it again under a fresh id", "event", out.event, "id", id)
		id = out.id + "-" + rand.Text()[:16]
	}
	return fmt.Errorf("announcing %s: its message ids were taken", out.event)
}

// ours reports whether the event the stream keeps at seq stands for this
// one: this machine's, adopted's (the machine whose outcome is announced
// again), or that of a machine whose claim of the ask records the same
// message id (one that adopted this machine's outcome, whose event the
// controller accepts). An event that cannot be read is taken as ours: the
// id is unguessable until it is recorded.
func (a *Agent) ours(ctx context.Context, seq uint64, adopted, ask, id string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	st, err := a.js.Stream(ctx, mesh.EventsStream)
	if err != nil {
		return true
	}
	m, err := st.GetMsg(ctx, seq)
	if err != nil {
		return true
	}
	_, machine, _, ok := mesh.SplitHolderEventSubject(m.Subject)
	switch {
	case !ok:
		return false
	case machine == a.cfg.Machine || machine == adopted:
		return true
	case a.claims == nil || ask == "":
		return false
	}
	rec, found, err := claim.ReadAsk(ctx, a.js, a.claims.Bucket(), ask, machine)
	return err != nil || (found && rec.MsgID == id)
}

// askOf is the ask an outcome's event is about.
func askOf(body any) string {
	switch b := body.(type) {
	case mesh.Built:
		return b.Ask
	case mesh.Failed:
		return b.Ask
	case map[string]any:
		s, _ := b["ask"].(string)
		return s
	}
	return ""
}

// announceRetry is how publish waits between attempts to publish an event.
var announceRetry = backoff.Policy{First: 100 * time.Millisecond, Max: 5 * time.Second}

// announceAttempts bounds publish's attempts.
const announceAttempts = 9

// tellHandedBack announces that the ask went back to the queue (its claim
// settled as released first, so the controller's fence finds the release).
// It is a note for people, not an outcome: published once, within a
// moment, and not retried — the ask is in the queue either way, and a
// healthy machine's retry is not held up by a bus that does not answer.
//
// A catalogue raised by an older version declares no handed-back (no
// stream takes it: ErrNoStreamResponse; credentials issued from it may
// not publish it: each publish waits out its timeout): after such an
// answer, or handedBackMisses timeouts in a row, hand-backs are not
// announced for handedBackPause, said once, so that none waits out a
// publish that cannot land.
func (a *Agent) tellHandedBack(ctx context.Context, log *slog.Logger, hb mesh.HandedBack) {
	if until := a.backPause.Load(); a.cfg.QuietHandBacks || until != 0 && time.Since(a.started) < time.Duration(until) {
		return
	}
	data, err := json.Marshal(hb)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handedBackWait)
	defer cancel()
	id := fmt.Sprintf("%s-%s-%d-%s", hb.Ask, mesh.EventHandedBack, hb.Attempt, a.nonce)
	subj := mesh.HolderEventSubject(mesh.BuildSeat, a.cfg.Machine, mesh.EventHandedBack)
	_, err = a.js.Publish(ctx, subj, data, jetstream.WithMsgID(id))
	if err == nil {
		a.backMisses.Store(0)
		return
	}
	undeclared := errors.Is(err, jetstream.ErrNoStreamResponse)
	if undeclared || a.backMisses.Add(1) >= handedBackMisses {
		a.backMisses.Store(0)
		a.backPause.Store(int64(time.Since(a.started) + handedBackPause))
		log.Warn("hand-backs are not announced for a while: the catalogue this farm was raised with (or these credentials) may not declare the build seat's handed-back event; raise it with this version, and reissue the machines' credentials, for `builds show` to say why an ask waits",
			"subject", subj, "pause", handedBackPause, "err", err)
		return
	}
	log.Warn("announcing the hand-back failed; the ask is back in the queue all the same", "subject", subj, "err", err)
}

// handedBackMisses is how many hand-backs in a row may fail to be
// announced before they are paused (handedBackPause).
const handedBackMisses = 3

// handedBackPause is how long hand-backs are not announced after they
// could not be.
const handedBackPause = 5 * time.Minute

// handedBackWait bounds the announcement of a hand-back.
const handedBackWait = 2 * time.Second

// reportAfter publishes one of the seat's events on this machine's subject
// (mesh.HolderEventSubject), deduplicated by id and this agent's nonce (an
// id another principal could guess and take first would have the stream
// drop the genuine event as a duplicate: issue 19; publish retries, and
// carries on when ctx is cancelled: a stopping agent still announces what
// it did), once delay has passed, beside the caller (in a goroutine), unless the
// returned func is called first: the event is then dropped. Called once
// the event is out, it waits until its publish is done. A delay of 0 or
// less publishes at once. (started: a build that ends within
// Config.StartedDelay announces only its outcome, a write, a delivery, an
// acknowledgement and a claim read fewer on the bus per build.)
func (a *Agent) reportAfter(ctx context.Context, delay time.Duration, event, id string, v any) (settle func()) {
	var mu sync.Mutex
	sent, dropped := false, false
	done := make(chan struct{})
	send := func() {
		mu.Lock()
		defer mu.Unlock()
		if dropped {
			return
		}
		sent = true
		go func() {
			defer close(done)
			data, err := json.Marshal(v)
			if err != nil {
				a.log.Error("encoding an event", "event", event, "err", err)
				return
			}
			// publish in a goroutine, not jetstream's PublishAsync,
			// whose replies take a subscription more per connection
			// (10,000 more on the server of a fleet that size) and whose
			// futures a closed connection leaves unanswered.
			_, _ = a.publish(ctx, event, id+"-"+a.nonce, data)
		}()
	}
	var timer *time.Timer
	if delay <= 0 {
		send()
	} else {
		timer = time.AfterFunc(delay, send)
	}
	// Called again, it does what it did the first time.
	return func() {
		mu.Lock()
		if !sent {
			dropped = true
			if timer != nil {
				timer.Stop()
			}
			mu.Unlock()
			return
		}
		mu.Unlock()
		<-done
	}
}

// publish publishes one of the seat's events on this machine's subject,
// deduplicated by id, retrying for a while (announceRetry,
// announceAttempts) while the connection is open. It carries on when ctx
// is cancelled (a stopping agent still announces what it did).
func (a *Agent) publish(ctx context.Context, event, id string, data []byte) (*jetstream.PubAck, error) {
	subj := mesh.HolderEventSubject(mesh.BuildSeat, a.cfg.Machine, event)
	ctx = context.WithoutCancel(ctx)
	var ack *jetstream.PubAck
	// A connection closed for good (the agent stopping, or its owner
	// closed it) answers no try.
	open := func(error) bool { return !a.nc.IsClosed() }
	err := announceRetry.Retry(ctx, announceAttempts, open, func() error {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var err error
		ack, err = a.js.Publish(pctx, subj, data, jetstream.WithMsgID(id))
		if err != nil {
			a.log.Warn("announcing failed", "subject", subj, "err", err)
		}
		return err
	})
	if err != nil {
		a.log.Error("announcing failed; giving up", "subject", subj, "err", err)
	}
	return ack, err
}
