package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// Worker does the work of one ask: check the source out, build, push, verify.
// Its errors wrap ErrSource, ErrBuild, ErrPush or ErrInfra (see Classify).
type Worker interface {
	Work(ctx context.Context, ask mesh.Ask, log func(line string)) (Result, error)
}

// Result is what a successful Work produced.
type Result struct {
	Digest string
	Ref    string // repository@digest
	// Commit is the full hash built; empty means the ask's commit.
	Commit    string
	Bytes     int64
	CacheHits int
	Steps     int
}

// Observer is told what the agent does, for metrics. Every method must be
// safe for concurrent use and quick.
type Observer interface {
	IdleWaited(d time.Duration)
	Began()
	Ended(outcome, reason string, d time.Duration, bytes int64, cacheHits int)
}

type nopObserver struct{}

func (nopObserver) IdleWaited(time.Duration)                        {}
func (nopObserver) Began()                                          {}
func (nopObserver) Ended(string, string, time.Duration, int64, int) {}

// Agent is a holder of the build seat: each of its slots pulls one ask at a
// time from the seat's one shared consumer, works it, reports and settles it,
// and only then pulls the next.
type Agent struct {
	cfg    Config
	js     jetstream.JetStream
	nc     *nats.Conn
	worker Worker
	log    *slog.Logger
	obs    Observer

	inFlight atomic.Int64
	built    atomic.Int64
	failed   atomic.Int64
	started  time.Time
	cancels  sync.Map // ask id -> context.CancelCauseFunc
}

// New returns an agent from a validated config and its dependencies. A nil
// logger discards; a nil observer observes nothing.
func New(cfg Config, js jetstream.JetStream, worker Worker, log *slog.Logger, obs Observer) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if js == nil || worker == nil {
		return nil, fmt.Errorf("%w: a JetStream handle and a worker are required", ErrConfig)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if obs == nil {
		obs = nopObserver{}
	}
	return &Agent{cfg: cfg, js: js, nc: js.Conn(), worker: worker, log: log, obs: obs, started: time.Now()}, nil
}

// ErrStopped is the cause given to a build cut short because its agent is
// stopping; its ask is handed back, not failed.
var ErrStopped = errors.New("agent stopping")

// Run works asks until ctx is done. Then it stops fetching, lets the builds
// in hand finish within the grace period, and hands back (Nak) any ask still
// unfinished so another machine takes it at once.
func (a *Agent) Run(ctx context.Context) error {
	cons, err := a.bind(ctx)
	if err != nil {
		return err
	}
	status, err := a.serveStatus()
	if err != nil {
		return err
	}
	defer status.Unsubscribe()
	cancelSub, err := a.serveCancel()
	if err != nil {
		return err
	}
	defer cancelSub.Unsubscribe()
	a.log.Info("holding the build seat", "machine", a.cfg.Machine, "slots", a.cfg.Slots,
		"consumer", mesh.SeatStream(mesh.BuildSeat)+"/"+mesh.SeatConsumer(mesh.BuildSeat))

	// work outlives ctx by the grace period.
	work, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelWork(nil)
	stopGrace := context.AfterFunc(ctx, func() {
		a.log.Info("stopping: no new asks; builds in hand may finish", "grace", a.cfg.Grace)
		t := time.NewTimer(a.cfg.Grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancelWork(ErrStopped)
		case <-work.Done():
		}
	})
	defer stopGrace()

	var wg sync.WaitGroup
	for slot := range a.cfg.Slots {
		wg.Go(func() { a.slot(ctx, work, cons, slot) })
	}
	wg.Wait()
	return nil
}

// bind looks up the seat's consumer, waiting for the controller's raise if
// it is not there yet.
func (a *Agent) bind(ctx context.Context) (jetstream.Consumer, error) {
	stream, name := mesh.SeatStream(mesh.BuildSeat), mesh.SeatConsumer(mesh.BuildSeat)
	delay := 250 * time.Millisecond
	for {
		cons, err := a.js.Consumer(ctx, stream, name)
		if err == nil {
			return cons, nil
		}
		if !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("binding consumer %s/%s: %w", stream, name, err)
		}
		a.log.Warn("the seat's queue is not raised yet; waiting for the controller", "consumer", stream+"/"+name)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// slot pulls one ask at a time until ctx is done.
func (a *Agent) slot(ctx, work context.Context, cons jetstream.Consumer, slot int) {
	idle := time.Now() // since the slot last settled an ask
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(a.cfg.FetchWait))
		if err != nil {
			a.log.Warn("fetch failed", "slot", slot, "err", err)
			sleepCtx(ctx, time.Second)
			continue
		}
		for msg := range batch.Messages() {
			if ctx.Err() != nil {
				// Stopping: an ask that arrived now goes straight back.
				_ = msg.Nak()
				continue
			}
			a.obs.IdleWaited(time.Since(idle))
			a.handle(work, msg)
			idle = time.Now()
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			a.log.Warn("fetch ended", "slot", slot, "err", err)
			sleepCtx(ctx, time.Second)
		}
	}
}

// handle works one ask and settles it.
func (a *Agent) handle(work context.Context, msg jetstream.Msg) {
	attempt := 1
	if md, err := msg.Metadata(); err == nil {
		attempt = int(md.NumDelivered)
	}
	a.obs.Began()
	ask, err := mesh.DecodeAsk(msg.Data())
	if err == nil && a.cfg.Known != nil && !a.cfg.Known(ask.Module) {
		err = fmt.Errorf("%w: module %q is not built by this catalogue", mesh.ErrMalformedAsk, ask.Module)
	}
	if err != nil {
		// A malformed ask is refused once and never redelivered. Its id
		// may be missing or wrong: the failed is deduplicated by the ask's
		// place in the queue instead.
		dedupe := "malformed-" + strconv.Itoa(attempt)
		if md, err := msg.Metadata(); err == nil {
			dedupe = fmt.Sprintf("malformed-%s-%d", md.Stream, md.Sequence.Stream)
		}
		if a.report(work, mesh.EventFailed, dedupe, mesh.Failed{
			Version: mesh.AskVersion, Ask: ask.ID, Plan: ask.Plan, Module: ask.Module, On: a.cfg.Machine,
			Reason: mesh.ReasonAsk, Message: err.Error(), Attempt: attempt, At: time.Now().UTC(),
		}) != nil {
			a.settle(msg, "nak", msg.NakWithDelay(a.cfg.RetryDelay))
			a.obs.Ended("handed-back", "", 0, 0, 0)
			return
		}
		a.settle(msg, "term", msg.TermWithReason("malformed ask"))
		a.failed.Add(1)
		a.obs.Ended(mesh.EventFailed, mesh.ReasonAsk, 0, 0, 0)
		a.log.Warn("refused a malformed ask", "err", err)
		return
	}
	if ask.Platform != "" && !slices.Contains(a.cfg.Platforms, ask.Platform) {
		// Not ours to build: give it back for a machine that can.
		a.settle(msg, "nak", msg.NakWithDelay(a.cfg.RetryDelay))
		a.obs.Ended("handed-back", "", 0, 0, 0)
		return
	}
	log := a.log.With("ask", ask.ID, "module", ask.Module, "plan", ask.Plan, "attempt", attempt)
	a.inFlight.Add(1)
	defer a.inFlight.Add(-1)
	begun := time.Now()

	_ = a.report(work, mesh.EventStarted, fmt.Sprintf("%s-started-%d", ask.ID, attempt), mesh.Started{
		Version: mesh.AskVersion, Ask: ask.ID, Plan: ask.Plan, Module: ask.Module,
		On: a.cfg.Machine, Attempt: attempt, At: begun.UTC(),
	})

	buildCtx, cancel := context.WithCancelCause(work)
	defer cancel(nil)
	a.cancels.Store(ask.ID, cancel)
	defer a.cancels.Delete(ask.ID)

	// Heartbeat: builds outlast any ack wait.
	hbDone := make(chan struct{})
	go a.heartbeat(msg, hbDone, log)
	logs := newLogBatcher(a, ask.ID, a.cfg.LogBatchLines, a.cfg.LogFlush, a.cfg.FailedLogLines)
	res, err := a.worker.Work(buildCtx, ask, logs.Line)
	close(hbDone)
	logs.Close()
	took := time.Since(begun)

	if err != nil && errors.Is(context.Cause(buildCtx), ErrStopped) {
		log.Warn("stopping: handing the ask back", "after", took.Round(time.Millisecond))
		a.settle(msg, "nak", msg.Nak())
		a.obs.Ended("handed-back", "", took, 0, 0)
		return
	}
	if err == nil {
		commit := res.Commit
		if commit == "" {
			commit = ask.Source.Commit
		}
		if err := a.report(work, mesh.EventBuilt, ask.ID+"-built", mesh.Built{
			Version: mesh.AskVersion, Ask: ask.ID, Plan: ask.Plan, Module: ask.Module,
			Commit: commit, Digest: res.Digest, Image: res.Ref, On: a.cfg.Machine,
			Duration: took, Bytes: res.Bytes, CacheHits: res.CacheHits, Steps: res.Steps, At: time.Now().UTC(),
		}); err != nil {
			a.giveBack(msg, log, "built", took, err)
			return
		}
		a.settle(msg, "ack", msg.DoubleAck(work))
		a.built.Add(1)
		a.obs.Ended(mesh.EventBuilt, "", took, res.Bytes, res.CacheHits)
		log.Info("built", "digest", res.Digest, "took", took.Round(time.Millisecond))
		return
	}
	reason := Classify(err)
	if cause := context.Cause(buildCtx); errors.Is(cause, ErrCancelled) {
		reason = mesh.ReasonCancel
	}
	if reason == mesh.ReasonInfra && attempt < a.cfg.MaxAttempts {
		delay := a.cfg.retryDelay(attempt)
		log.Warn("infrastructure failure; retrying later", "err", err, "delay", delay, "of", a.cfg.MaxAttempts)
		a.settle(msg, "nak", msg.NakWithDelay(delay))
		a.obs.Ended("retried", reason, took, 0, 0)
		return
	}
	if err := a.report(work, mesh.EventFailed, ask.ID+"-failed", mesh.Failed{
		Version: mesh.AskVersion, Ask: ask.ID, Plan: ask.Plan, Module: ask.Module, On: a.cfg.Machine,
		Reason: reason, Message: oneLine(err), Log: logs.Tail(), Attempt: attempt, At: time.Now().UTC(),
	}); err != nil {
		a.giveBack(msg, log, "failed", took, err)
		return
	}
	a.settle(msg, "term", msg.TermWithReason(reason))
	a.failed.Add(1)
	a.obs.Ended(mesh.EventFailed, reason, took, 0, 0)
	log.Warn("failed", "reason", reason, "err", err)
}

// giveBack hands an ask whose outcome could not be announced back to the
// queue: an outcome nobody heard is not settled.
func (a *Agent) giveBack(msg jetstream.Msg, log *slog.Logger, outcome string, took time.Duration, err error) {
	log.Error(outcome+" but not announced: giving the ask back", "err", err)
	a.settle(msg, "nak", msg.NakWithDelay(a.cfg.RetryDelay))
	a.obs.Ended("handed-back", "", took, 0, 0)
}

// ErrCancelled is the cause given to a build whose plan was cancelled.
var ErrCancelled = errors.New("plan cancelled")

// Cancel cuts short the build of ask id on this agent, if it is working on
// it; the ask is then failed{cancelled} and settled.
func (a *Agent) Cancel(id string) bool {
	if c, ok := a.cancels.Load(id); ok {
		c.(context.CancelCauseFunc)(ErrCancelled)
		return true
	}
	return false
}

func (a *Agent) heartbeat(msg jetstream.Msg, done <-chan struct{}, log *slog.Logger) {
	every := a.cfg.Heartbeat
	if every <= 0 {
		every = mesh.HolderAckWait / 3
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			if err := msg.InProgress(); err != nil {
				log.Warn("heartbeat failed", "err", err)
			}
		}
	}
}

// report publishes one of the seat's events, deduplicated by id, retrying
// for a while: an outcome is announced before its ask is settled.
// It returns an error when the event could not be announced; an outcome
// that was not announced is not settled (the ask is given back instead), so
// nothing acknowledged is ever unannounced.
func (a *Agent) report(ctx context.Context, event, id string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		a.log.Error("encoding an event", "event", event, "err", err)
		return err
	}
	subj := mesh.SeatEventSubject(mesh.BuildSeat, event)
	delay := 100 * time.Millisecond
	for i := 0; ; i++ {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err := a.js.Publish(pctx, subj, data, jetstream.WithMsgID(id))
		cancel()
		if err == nil {
			return nil
		}
		if i >= 8 {
			a.log.Error("announcing failed; giving up", "subject", subj, "err", err)
			return err
		}
		a.log.Warn("announcing failed; retrying", "subject", subj, "err", err)
		time.Sleep(delay)
		delay = min(2*delay, 5*time.Second)
	}
}

func (a *Agent) settle(msg jetstream.Msg, how string, err error) {
	if err != nil {
		a.log.Warn("settling an ask failed; it will be redelivered after the ack wait", "how", how, "err", err)
	}
}

// Status is what an agent answers to the seat's status tool.
type Status struct {
	Machine   string    `json:"machine"`
	Slots     int       `json:"slots"`
	InFlight  int64     `json:"in_flight"`
	Built     int64     `json:"built"`
	Failed    int64     `json:"failed"`
	Platforms []string  `json:"platforms"`
	Since     time.Time `json:"since"`
	At        time.Time `json:"at"`
}

// Status reports the agent's counters now.
func (a *Agent) Status() Status {
	return Status{
		Machine: a.cfg.Machine, Slots: a.cfg.Slots, InFlight: a.inFlight.Load(),
		Built: a.built.Load(), Failed: a.failed.Load(), Platforms: a.cfg.Platforms,
		Since: a.started.UTC(), At: time.Now().UTC(),
	}
}

// StatusTool is the tool every holder of the build seat serves: a request
// on it is answered by every agent online (scatter-gather).
const StatusTool = "status"

func (a *Agent) serveStatus() (*nats.Subscription, error) {
	subj := mesh.SeatToolSubject(mesh.BuildSeat, StatusTool)
	sub, err := a.nc.Subscribe(subj, func(m *nats.Msg) {
		data, _ := json.Marshal(a.Status())
		_ = m.Respond(data)
	})
	if err != nil {
		return nil, fmt.Errorf("serving %s: %w", subj, err)
	}
	return sub, nil
}

// serveCancel answers the seat's cancel tool: the asks named that this agent
// is working on are cut short, failed{cancelled} and settled.
func (a *Agent) serveCancel() (*nats.Subscription, error) {
	subj := mesh.SeatToolSubject(mesh.BuildSeat, mesh.CancelTool)
	sub, err := a.nc.Subscribe(subj, func(m *nats.Msg) {
		var req mesh.Cancel
		if err := json.Unmarshal(m.Data, &req); err != nil {
			a.log.Warn("refusing a malformed cancel", "err", err)
			return
		}
		var mine []string
		for _, id := range req.Asks {
			if a.Cancel(id) {
				mine = append(mine, id)
			}
		}
		if len(mine) > 0 {
			a.log.Info("cancelled", "asks", mine)
		}
		if m.Reply != "" {
			data, _ := json.Marshal(mesh.Cancel{Asks: mine})
			_ = m.Respond(data)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("serving %s: %w", subj, err)
	}
	return sub, nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func oneLine(err error) string {
	s := err.Error()
	for i, r := range s {
		if r == '\n' {
			s = s[:i]
			break
		}
	}
	if len(s) > 500 {
		s = s[:500] + "…"
	}
	return s
}

// AskStatus asks every agent online for its status and collects the answers
// that arrive within wait.
func AskStatus(ctx context.Context, nc *nats.Conn, wait time.Duration) ([]Status, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(mesh.SeatToolSubject(mesh.BuildSeat, StatusTool), inbox, nil); err != nil {
		return nil, err
	}
	var out []Status
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			break
		}
		m, err := sub.NextMsg(left)
		if err != nil {
			break
		}
		var st Status
		if json.Unmarshal(m.Data, &st) == nil {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Machine, b.Machine) })
	return out, nil
}
