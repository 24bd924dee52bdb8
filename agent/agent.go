package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
)

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

	// beat is how often a slot heartbeats its ask (heartbeatEvery), set
	// when Run binds the consumer.
	beat time.Duration

	inFlight atomic.Int64
	builtN   atomic.Int64
	failedN  atomic.Int64
	started  time.Time
	running  running
	health   health
	// claims is the seat's ask claims bucket; nil when it is not raised.
	claims jetstream.KeyValue
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

// Run works asks until ctx is done. Then it stops fetching, lets the builds
// in hand finish within the grace period, and hands back (Nak) any ask still
// unfinished so another machine takes it at once.
func (a *Agent) Run(ctx context.Context) error {
	cons, err := a.bind(ctx)
	if err != nil {
		return err
	}
	a.beat = heartbeatEvery(a.cfg.Heartbeat, cons.CachedInfo().Config.AckWait)
	a.claims = a.askClaims(ctx)
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
	// The tools are served (the server has the subscriptions) before the
	// first probe or pull, so that what they do can be asked about.
	if err := a.nc.Flush(); err != nil {
		return fmt.Errorf("serving the seat's tools: %w", err)
	}
	a.log.Info("holding the build seat", "machine", a.cfg.Machine, "slots", a.cfg.Slots, "heartbeat", a.beat,
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

// bindRetry is how bind waits for the controller to raise the seat's queue.
var bindRetry = backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second}

// bind looks up the seat's consumer, waiting for the controller's raise if
// it is not there yet.
func (a *Agent) bind(ctx context.Context) (jetstream.Consumer, error) {
	stream, name := mesh.SeatStream(mesh.BuildSeat), mesh.SeatConsumer(mesh.BuildSeat)
	notRaised := func(err error) bool {
		return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
	}
	var cons jetstream.Consumer
	err := bindRetry.Retry(ctx, 0, notRaised, func() error {
		var err error
		cons, err = a.js.Consumer(ctx, stream, name)
		if notRaised(err) {
			a.log.Warn("the seat's queue is not raised yet; waiting for the controller", "consumer", stream+"/"+name)
		}
		return err
	})
	switch {
	case err == nil:
		return cons, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	default:
		return nil, fmt.Errorf("binding consumer %s/%s: %w", stream, name, err)
	}
}

// slot pulls one ask at a time until ctx is done.
func (a *Agent) slot(ctx, work context.Context, cons jetstream.Consumer, slot int) {
	idle := time.Now() // since the slot last settled an ask
	for ctx.Err() == nil {
		if !a.awaitHealthy(ctx) {
			continue // stopping
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(a.cfg.FetchWait))
		if err != nil {
			a.log.Warn("fetch failed", "slot", slot, "err", err)
			_ = backoff.Wait(ctx, time.Second)
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
			_ = backoff.Wait(ctx, time.Second)
		}
	}
}

// Status is what an agent answers to the seat's status tool.
type Status struct {
	Machine   string   `json:"machine"`
	Slots     int      `json:"slots"`
	InFlight  int64    `json:"in_flight"`
	Built     int64    `json:"built"`
	Failed    int64    `json:"failed"`
	Platforms []string `json:"platforms"`
	// Health is HealthHealthy, or HealthUnhealthy while the machine cannot
	// build (its BuildKit does not answer): it takes no asks then. Why
	// says what its probe found, since when.
	Health      string    `json:"health"`
	Why         string    `json:"why,omitempty"`
	HealthSince time.Time `json:"health_since,omitzero"`
	Since       time.Time `json:"since"`
	At          time.Time `json:"at"`
}

// The health of a machine, as Status says it.
const (
	HealthHealthy   = "healthy"
	HealthUnhealthy = "unhealthy"
)

// Status reports the agent's counters now.
func (a *Agent) Status() Status {
	st := Status{
		Machine: a.cfg.Machine, Slots: a.cfg.Slots, InFlight: a.inFlight.Load(),
		Built: a.builtN.Load(), Failed: a.failedN.Load(), Platforms: a.cfg.Platforms,
		Health: HealthHealthy, Since: a.started.UTC(), At: time.Now().UTC(),
	}
	if why, since := a.health.state(); why != "" {
		st.Health, st.Why, st.HealthSince = HealthUnhealthy, why, since.UTC()
	}
	return st
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

// publishLog publishes one batch of a build's output on log.<ask>. Logs
// are best effort: a core publish, kept by the LOGS stream.
func (a *Agent) publishLog(b mesh.LogBatch) {
	b.On = a.cfg.Machine
	data, err := json.Marshal(b)
	if err != nil {
		return
	}
	if err := a.nc.Publish(mesh.SeatEventSubject(mesh.BuildSeat, mesh.LogEvent(b.Ask)), data); err != nil {
		a.log.Warn("publishing build output", "ask", b.Ask, "err", err)
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
