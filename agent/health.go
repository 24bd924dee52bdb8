package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/distribution/reference"

	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/registry"
)

// Prober is the part of a Worker that says whether the machine can build
// now: its BuildKit and its registry (what else it needs) answer. A Worker
// that is not one is taken as always able. Probe's error says why not.
type Prober interface {
	Probe(ctx context.Context) error
}

// HealthObserver is the part of an Observer told when the machine turns
// sick or well; an Observer that is not one is not told.
type HealthObserver interface {
	Healthy(ok bool)
}

// Probe implements Prober: the workspace can take a build's source
// (Sources.Probe: writable, with Sources.MinFree free), the builder
// answers, if it can say so, and so does the mesh's registry (w.Registry,
// or the registry of the last ask's image), if the builder can ask it: a registry that cannot be reached or
// answers 5xx stops the machine as its BuildKit would. A registry that
// answers but refuses (401) is not the machine's sickness: the push fails
// and says so.
func (w *BuildWorker) Probe(ctx context.Context) error {
	if err := w.Sources.Probe(); err != nil {
		return err
	}
	if err := w.pingBuilder(ctx); err != nil {
		return err
	}
	return w.pingRegistry(ctx)
}

// pingBuilder asks the builder whether it answers, if it can say so.
func (w *BuildWorker) pingBuilder(ctx context.Context) error {
	if p, ok := w.Builder.(interface{ Ping(context.Context) error }); ok {
		return p.Ping(ctx)
	}
	return nil
}

// pingRegistry asks the mesh's registry (w.Registry, or the registry of
// the last ask's image) whether it answers, if the builder can ask it.
func (w *BuildWorker) pingRegistry(ctx context.Context) error {
	host := w.Registry
	if host == "" {
		host = w.lastRegistry.get()
	}
	if p, ok := w.Builder.(registryPinger); ok && host != "" {
		return p.PingRegistry(ctx, host)
	}
	return nil
}

// BuilderPinger is the part of a Worker that says whether what a build
// waits on answers — its builder (its BuildKit), and its registry if it
// answers at all: asked while a build goes on, so that a daemon that
// stopped answering (hung, or stopped with SIGSTOP) does not hold the ask
// for as long as it stands still.
type BuilderPinger interface {
	PingBuilder(ctx context.Context) error
}

// PingBuilder implements BuilderPinger: the builder answers, if it can say
// so, and so does the registry the build pushes to (Probe's), if the
// builder can ask it. Only a registry that gives no answer at all within
// ctx counts: one that stands still (stopped with SIGSTOP, say) holds
// BuildKit's push for as long as it does, while one that refuses or fails
// a request fails the push, which says so.
func (w *BuildWorker) PingBuilder(ctx context.Context) error {
	if err := w.pingBuilder(ctx); err != nil {
		return err
	}
	// No answer: the ping's time ran out (ctx's, or the registry
	// client's own bound on a ping).
	if err := w.pingRegistry(ctx); err != nil && (ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)) {
		return err
	}
	return nil
}

// errBuilderGone is the cause of a build stopped because its builder no
// longer answered (watchBuilder).
var errBuilderGone = errors.New("the build was stopped")

// builderMisses is how many pings in a row a building machine's builder may
// leave unanswered before the build is stopped.
const builderMisses = 2

// watchBuilder pings the worker's builder (and registry: PingBuilder) every third of
// Config.ProbeEvery while ask id is built (10 s by default), each ping
// bounded by ProbeTimeout; builderMisses in a row unanswered stop the
// build, about 30 s after the builder stood still by default (cause
// errBuilderGone, with the last ping's error): its ask then goes back at
// once for another machine, and this machine turns sick until its builder
// answers (work). A builder that answers slowly is not stopped: only one
// that does not answer at all within ProbeTimeout, twice. The returned
// func ends the watch.
func (a *Agent) watchBuilder(ctx context.Context, id string) (stop func()) {
	p, ok := a.worker.(BuilderPinger)
	if !ok || a.cfg.ProbeEvery <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		every := max(a.cfg.ProbeEvery/3, time.Millisecond)
		tick := time.NewTicker(every)
		defer tick.Stop()
		misses := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			pctx, pcancel := context.WithTimeout(ctx, a.cfg.ProbeTimeout)
			err := p.PingBuilder(pctx)
			pcancel()
			switch {
			case ctx.Err() != nil:
				return
			case err == nil:
				misses = 0
				continue
			}
			misses++
			a.log.Warn("the builder does not answer while it builds", "ask", id, "misses", misses, "of", builderMisses, "err", oneLine(err))
			if misses >= builderMisses {
				a.running.stopWith(id, fmt.Errorf("%w; %w after %d pings %s apart went unanswered", err, errBuilderGone, misses, every))
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}

// registryPinger is the part of a Builder that asks a registry whether it
// answers.
type registryPinger interface {
	PingRegistry(ctx context.Context, host string) error
}

// PingRegistry asks the registry at host ("127.0.0.1:5000") whether it
// answers, with the client builds are verified with. Its error, when the
// registry cannot be reached or answers 5xx (registry.IsInfra), wraps
// ErrInfra; any other answer is nil.
func (b *BuildKit) PingRegistry(ctx context.Context, host string) error {
	err := b.opts.Registry.Ping(ctx, host)
	if registry.IsInfra(err) {
		return classified(ErrInfra, fmt.Sprintf("registry %s does not answer: %s", host, lastLine(err.Error())), err)
	}
	return nil
}

// lastRegistry is the registry host of the last ask a worker took.
type lastRegistry struct {
	mu   sync.Mutex
	host string
}

// saw records the registry of image, a repository ("host:port/name").
func (l *lastRegistry) saw(image string) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.host = reference.Domain(named)
}

func (l *lastRegistry) get() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.host
}

// health is whether the machine can build: a sick machine stops pulling,
// probes with backoff and resumes when the probe answers.
type health struct {
	mu     sync.Mutex
	why    string // "" while healthy
	since  time.Time
	probed time.Time  // the last probe of a healthy machine
	probe  sync.Mutex // one prober at a time
}

// due reports whether a healthy machine is due a probe (every), and if so
// counts it as probed now.
func (h *health) due(every time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if every <= 0 || time.Since(h.probed) < every {
		return false
	}
	h.probed = time.Now()
	return true
}

func (h *health) state() (why string, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.why, h.since
}

// set records the machine's health; it reports whether it changed.
func (h *health) set(why string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if (h.why == "") == (why == "") {
		h.why = why
		return false
	}
	h.why, h.since = why, time.Now()
	return true
}

// probePolicy is how a sick machine probes: 1s, 2s, 4s … up to 30s, and
// never less often than every twentieth of retryFor (at least every
// minProbe): a sick machine settles the ask it takes between probes when
// its budget is gone (pass), so the probe interval bounds how late an ask
// settles past its budget (issue 20: within ±10%).
func probePolicy(retryFor time.Duration) backoff.Policy {
	most := min(30*time.Second, max(retryFor/20, minProbe))
	return backoff.Policy{First: min(time.Second, most), Max: most}
}

// minProbe is the shortest interval between a sick machine's probes.
const minProbe = 250 * time.Millisecond

// probe asks the worker whether the machine can build, within the probe
// timeout. A worker that cannot say is able.
func (a *Agent) probe(ctx context.Context) error {
	p, ok := a.worker.(Prober)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.ProbeTimeout)
	defer cancel()
	return p.Probe(ctx)
}

// sick marks the machine unhealthy for err.
func (a *Agent) sick(err error) {
	if a.health.set(oneLine(err)) {
		a.log.Error("this machine cannot build: no more asks until it can", "why", oneLine(err))
		if h, ok := a.obs.(HealthObserver); ok {
			h.Healthy(false)
		}
	}
}

// awaitHealthy returns at once on a healthy machine; on a sick one it
// probes with backoff (one slot probes, the others wait for it) until the
// probe answers or ctx is done, and reports whether the machine is healthy.
// Between two probes that fail, the probing slot takes at most one ask
// (passOne) and settles its budget without building it: so an ask settles
// failed{infra} when its budget is gone even while every machine is sick.
//
// A healthy machine is probed before its first pull and every
// Config.ProbeEvery after, so that a machine whose BuildKit is not there
// when it starts, or went away while it was idle, says so and takes no ask
// it cannot build.
func (a *Agent) awaitHealthy(ctx, work context.Context) bool {
	if why, _ := a.health.state(); why == "" {
		if !a.health.due(a.cfg.ProbeEvery) {
			return true
		}
		err := a.probe(ctx)
		if err == nil || ctx.Err() != nil {
			return true
		}
		a.sick(err)
	}
	a.health.probe.Lock()
	defer a.health.probe.Unlock()
	retry := probePolicy(a.cfg.RetryFor)
	for n := 1; ctx.Err() == nil; n++ {
		if why, _ := a.health.state(); why == "" {
			return true
		}
		begun := time.Now()
		err := a.probe(ctx)
		if err == nil {
			if a.health.set("") {
				a.log.Info("this machine can build again: taking asks")
				if h, ok := a.obs.(HealthObserver); ok {
					h.Healthy(true)
				}
			}
			return true
		}
		a.health.set(oneLine(err))
		a.passOne(ctx, work, n)
		d := retry.Delay(n)
		a.log.Warn("still cannot build", "why", oneLine(err), "next probe", d)
		// The probe and the pass count in the interval: an ask's
		// budget is met within one.
		if backoff.Wait(ctx, max(d-time.Since(begun), 0)) != nil {
			break
		}
	}
	return false
}

// passOne is what a sick machine does between two probes: it takes at
// most one ask, if one is waiting (from its platforms' queues in turn) and
// no other machine is there to take it, and handles it as a sick machine
// does (pass): the ask is claimed, and failed{infra} if its budget is
// gone, else handed back at once recording the budget. A healthy machine
// never comes here.
//
// Another machine is there when the queue has a pull waiting (a healthy
// idle machine), or when a machine that holds the platform's queue answers
// the seat's status tool healthy (a healthy busy one): then the sick
// machine leaves the queue alone, so that it neither takes asks from an
// idle machine nor starts the budget of an ask a busy one will build (nor
// says "no healthy machine" of it).
func (a *Agent) passOne(ctx, work context.Context, turn int) {
	cons, platform, ok := a.bound.Load().at(turn)
	if !ok {
		return
	}
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	info, err := cons.Info(ictx)
	cancel()
	if err != nil || info.NumPending+uint64(info.NumAckPending) == 0 || info.NumWaiting > 0 || a.healthyElsewhere(ctx, platform) {
		return
	}
	batch, err := cons.FetchNoWait(1)
	if err != nil {
		return
	}
	for msg := range batch.Messages() {
		if ctx.Err() != nil {
			_ = msg.Nak()
			continue
		}
		a.handle(work, msg)
	}
}

// healthyElsewhere reports whether another machine that holds platform's
// queue answers the seat's status tool healthy within healthyWait.
func (a *Agent) healthyElsewhere(ctx context.Context, platform string) bool {
	found := false
	_ = gatherStatus(ctx, a.nc, healthyWait, func(st Status) bool {
		found = st.Machine != a.cfg.Machine && st.Health == HealthHealthy && slices.Contains(st.Platforms, platform)
		return found
	})
	return found
}

// healthyWait is how long a sick machine waits for a healthy one to answer
// its status before it takes an ask.
const healthyWait = 200 * time.Millisecond
