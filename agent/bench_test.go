package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// The agent measured through the real parts: an embedded NATS server with
// the build seat raised, real agents, and for the build overhead the real
// BuildWorker (git checkout, BuildKit's Go client) against a real buildkitd
// and registry, side by side with bin/buildctl on the same daemon.
//
//	go test -run XXX -bench BenchmarkDispatch -benchtime 1x ./agent
//	MESHBUILD_BUILDKIT=1 go test -run XXX -bench BenchmarkAgentOverhead -benchtime 1x ./agent

// benchSeat raises the build seat on a fresh server and returns it and a
// connection whose core subscriptions see the seat's events as they are
// published.
func benchSeat(tb testing.TB) (*server.Server, *nats.Conn, jetstream.JetStream) {
	tb.Helper()
	s := natstest.Server(tb, nil)
	nc, js := natstest.Connect(tb, s)
	cat := mesh.NewCatalogue([]*mesh.Manifest{
		{Module: "build-agent", Seats: []mesh.Seat{{
			Seat: mesh.BuildSeat, Scope: "node", Accepts: []string{"build retain 7d"},
			Emits: []string{"started", "built", "failed", "log.*"}, Serves: []string{"status", "cancel"},
		}}},
		{Module: "build-controller", Holds: []string{"mesh-controller"}, Uses: []string{mesh.BuildSeat},
			Consumes: []string{"node-build-agent.started", "node-build-agent.built", "node-build-agent.failed"}},
	})
	if _, err := mesh.Raise(context.Background(), js, cat, 1); err != nil {
		tb.Fatal(err)
	}
	return s, nc, js
}

// benchAgents starts n agents of one slot, each with its own connection and
// the default config but its machine name, and waits until every one has a
// pull waiting. They are all stopped at once in cleanup.
func benchAgents(tb testing.TB, s *server.Server, js jetstream.JetStream, n int, w agent.Worker) {
	tb.Helper()
	ws := make([]agent.Worker, n)
	for i := range ws {
		ws[i] = w
	}
	benchAgentsEach(tb, s, js, ws)
}

// benchAgentsEach is benchAgents with a worker of its own for each agent:
// ws[i] is agent i's (a machine with its own buildkitd).
func benchAgentsEach(tb testing.TB, s *server.Server, js jetstream.JetStream, ws []agent.Worker) {
	tb.Helper()
	n := len(ws)
	var stops []func()
	for i, w := range ws {
		nc, ajs := natstest.Dial(tb, s.ClientURL())
		cfg := agent.DefaultConfig()
		cfg.Machine = fmt.Sprintf("bench-%d", i+1)
		a, err := agent.New(cfg, ajs, w, nil, nil)
		if err != nil {
			tb.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(ctx) }()
		stops = append(stops, func() { cancel(); <-done; nc.Close() })
	}
	tb.Cleanup(func() {
		var wg sync.WaitGroup
		for _, stop := range stops {
			wg.Go(stop)
		}
		wg.Wait()
	})
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
		if err == nil {
			if info, err := c.Info(ctx); err == nil && info.NumWaiting >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d agents not all pulling after 30s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// seatEvents timestamps the seat's events on arrival, by ask id, through a
// core subscription.
type seatEvents struct {
	mu      sync.Mutex
	arrived map[string]time.Time // event + "/" + ask
	failed  map[string]string
	logs    map[string][]string
	notify  chan struct{}
}

// logFinal names the arrival of a build's last batch of output.
const logFinal = "log-final"

func watchSeat(tb testing.TB, nc *nats.Conn) *seatEvents {
	tb.Helper()
	e := &seatEvents{arrived: map[string]time.Time{}, failed: map[string]string{}, logs: map[string][]string{},
		notify: make(chan struct{}, 1)}
	// A build's output; its last batch arrives as event logFinal.
	logs, err := nc.Subscribe(mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.LogEvent(">")), func(m *nats.Msg) {
		at := time.Now()
		var batch mesh.LogBatch
		if json.Unmarshal(m.Data, &batch) != nil {
			return
		}
		e.mu.Lock()
		e.logs[batch.Ask] = append(e.logs[batch.Ask], batch.Lines...)
		if batch.Final {
			e.arrived[logFinal+"/"+batch.Ask] = at
		}
		e.unlockAndWake()
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = logs.Unsubscribe() })
	for _, ev := range []string{mesh.EventStarted, mesh.EventBuilt, mesh.EventFailed} {
		sub, err := nc.Subscribe(mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, ev), func(m *nats.Msg) {
			at := time.Now()
			var v struct {
				Ask     string `json:"ask"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			}
			_ = json.Unmarshal(m.Data, &v)
			e.mu.Lock()
			e.arrived[ev+"/"+v.Ask] = at
			if ev == mesh.EventFailed {
				e.failed[v.Ask] = v.Reason + ": " + v.Message
			}
			e.unlockAndWake()
		})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return e
}

// wait returns when event arrived for ask; a failed of the ask fails tb.
// unlockAndWake unlocks e and wakes a wait, if one waits.
func (e *seatEvents) unlockAndWake() {
	e.mu.Unlock()
	select {
	case e.notify <- struct{}{}:
	default:
	}
}

func (e *seatEvents) wait(tb testing.TB, event, ask string, d time.Duration) time.Time {
	tb.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		at, ok := e.arrived[event+"/"+ask]
		why, failed := e.failed[ask]
		e.mu.Unlock()
		switch {
		case ok:
			return at
		case failed:
			tb.Fatalf("ask %s failed: %s", ask, why)
		}
		select {
		case <-e.notify:
		case <-deadline.C:
			tb.Fatalf("no %s for ask %s within %s", event, ask, d)
		}
	}
}

// cached reports whether the build of ask answered the Dockerfile step
// containing step (" RUN ") from the cache.
func (e *seatEvents) cached(ask, step string) (cached, found bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return stepCached(e.logs[ask], step)
}

// stepCached reads build output as the agent logs it and buildctl's plain
// progress prints it: "#7 [2/3] RUN …", later "#7 CACHED".
func stepCached(lines []string, step string) (cached, found bool) {
	vertex := ""
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if n, name, ok := strings.Cut(l, " "); ok && strings.HasPrefix(n, "#") && strings.HasPrefix(name, "[") && strings.Contains(name, step) {
			vertex = n
		}
		if vertex != "" && l == vertex+" CACHED" {
			return true, true
		}
	}
	return false, vertex != ""
}

func publishAsk(tb testing.TB, js jetstream.JetStream, a mesh.Ask) {
	tb.Helper()
	data, _ := json.Marshal(a)
	if _, err := js.Publish(context.Background(), mesh.BuildSubject(mesh.DefaultPlatform), data, jetstream.WithMsgID(a.ID)); err != nil {
		tb.Fatal(err)
	}
}

// quantile is the q-quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// instant is a worker that builds nothing, at once.
type instant struct{}

func (instant) Work(_ context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
	dg := "sha256:" + strings.Repeat("0", 64)
	return agent.Result{Digest: dg, Ref: a.Image + "@" + dg}, nil
}

// BenchmarkDispatch: 4 idle agents (default config, one slot each); 200
// asks published one at a time, each after the previous one's built. The
// latency runs from just before the ask is published (a JetStream publish,
// as the controller's) to the agent's claim of it stored (a watch of the
// ask claims bucket, meshtest.Claims: the build begins once it is). No
// buildkitd is needed: the worker builds nothing.
func BenchmarkDispatch(b *testing.B) {
	const agents = 4
	asks := 200
	if benchTiny() {
		asks = 20
	}
	s, nc, js := benchSeat(b)
	benchAgents(b, s, js, agents, instant{})
	ev := watchSeat(b, nc)
	claims := meshtest.WatchClaims(b, js)
	var lat []time.Duration
	run := 0
	for b.Loop() {
		run++
		for i := range asks {
			a := mesh.Ask{Version: mesh.AskVersion, ID: fmt.Sprintf("dispatch-%d-%d", run, i), Plan: "p-bench", Module: "tool",
				Source: mesh.Source{Repo: "https://git.example/x.git", Commit: "abc"}, Image: "127.0.0.1:1/tool"}
			t0 := time.Now()
			publishAsk(b, js, a)
			lat = append(lat, claims.Wait(b, a.ID, 10*time.Second).Sub(t0))
			ev.wait(b, mesh.EventBuilt, a.ID, 10*time.Second)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(ms(quantile(lat, 0.50)), "p50-ms")
	b.ReportMetric(ms(quantile(lat, 0.99)), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
}

// overheadDockerfile is built FROM the base by module name; the RUN reads
// the copied nonce, so a new nonce misses the cache from COPY on.
const overheadDockerfile = "FROM runtime\nCOPY nonce.txt /nonce.txt\nRUN cat /nonce.txt > /stamp && echo built\n"

// BenchmarkAgentOverhead builds the same small Dockerfile (FROM the busybox
// base by module name, a COPY and a RUN) on one buildkitd through an agent
// — the ask published, the real agent.BuildWorker with agent.NewBuildKit
// checking the commit out of a git repository, building, pushing and
// verifying, until built arrives — and through `bin/buildctl build` with
// the same frontend, base context and push, until it exits. Warm: nothing
// changed, COPY and RUN cached. Cold: a new nonce (a new commit for the
// agent, a new file for buildctl) makes COPY and RUN miss the cache; both
// are checked in the build output. Pruned: the same commit and files, the
// daemon's build cache emptied (buildctl prune --all) before every build. 15 pairs of each kind, the two paths in
// turn, which goes first alternating; the ratio is the median of the
// pairs' ratios (cold builds slow down as the daemon's store grows: pairs
// cancel the drift), the times are medians.
//
// The figure is the agent's own time per ask, outside BuildKit
// (*-own-ms): from publishing the ask to its built arriving, less the
// solve in buildkitd. Its parts, each a median: the bus and the events
// (*-events-ms: publish → the worker called, the worker returned → built
// arrived), the checkout (*-checkout-ms: BuildWorker.Work less
// BuildKit.Build — Sources.CheckoutCommit, git fetch and archive, and
// Release), the daemon ping before the solve (*-ping-ms) and the check
// after it that the registry resolves the pushed digest and its size
// (*-verify-ms). Work and Build are timed by wrapping the real worker and
// builder; ping and verify, which run inside BuildKit.Build, are the spans
// the build reports (agent.Spans). The ratio to buildctl is
// reported too, but says little: buildctl pays a process start and a new
// session each build, which the agent does not.
//
// Fully cached (cached-*): the cost on its machine of a build in which no
// step runs, as the farm sends it (the ask from cascade.Asks, with its
// registry build cache and an input key and commit, the same each build,
// so the cache is exported by the first only, and what it pushed is the
// answer of every later one, verified and not pushed again: BuildKit's
// reuse, as for a forced rebuild), from publishing the ask to built arriving — p50
// and p90 of 60 builds — and where it goes: the events, and the spans the
// build reports (checkout, ping, solve, and inside the solve the cache
// import, the export and push of the image and its attestations, the
// cache export; then verify). Beside it, in turn, the same with
// BuildKitOptions.History (cached-history-*: the solve recorded in
// buildkitd's history, as before), and the push verified as before
// (cached-verify-before-ms: five calls, one after another, each with its
// own connection). MESHBUILD_BENCH=tiny: one pair of each kind, 4
// cached builds of each.
func BenchmarkAgentOverhead(b *testing.B) {
	testenv.RequireBuildkit(b)
	runs := 15
	if benchTiny() {
		runs = 1
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	buildctl := filepath.Join(root, "bin", "buildctl")
	if _, err := os.Stat(buildctl); err != nil {
		b.Fatalf("%s: %v (make deps builds it)", buildctl, err)
	}
	host := registrytest.Registry(b)
	addr := testenv.Buildkitd(b, host)
	baseRef := testenv.Busybox(b, host)
	base := mesh.Base{Module: "runtime", Image: host + "/busybox", Digest: baseRef[strings.LastIndex(baseRef, "@")+1:]}

	gitDir, commit := testenv.GitRepo(b, map[string]string{"app/Dockerfile": overheadDockerfile, "app/nonce.txt": "warm\n"})
	direct := b.TempDir()
	for name, content := range map[string]string{"Dockerfile": overheadDockerfile, "nonce.txt": "warm\n"} {
		if err := os.WriteFile(filepath.Join(direct, name), []byte(content), 0o644); err != nil {
			b.Fatal(err)
		}
	}

	s, nc, js := benchSeat(b)
	regc := registry.NewClient(registry.WithInsecure(true))
	bk, err := agent.NewBuildKit(addr, agent.BuildKitOptions{Registry: regc})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bk.Close() })
	tb := &timedBuilder{b: bk}
	tw := &timedWorker{w: &agent.BuildWorker{Sources: &agent.Sources{Dir: b.TempDir()}, Builder: tb}}
	benchAgents(b, s, js, 1, tw)
	ev := watchSeat(b, nc)

	n := 0
	// parts are, per agent run, its own time and the parts of it.
	var parts []ownParts
	// viaAgent builds commit through the agent; warm says whether its RUN
	// must come from the cache or miss it.
	viaAgent := func(commit string, warm bool) time.Duration {
		n++
		a := mesh.Ask{Version: mesh.AskVersion, ID: fmt.Sprintf("overhead-%d", n), Plan: "p-bench", Module: "app",
			Source: mesh.Source{Repo: gitDir, Commit: commit, Path: "app"},
			Image:  host + "/via-agent", Bases: []mesh.Base{base}}
		t0 := time.Now()
		publishAsk(b, js, a)
		arrived := ev.wait(b, mesh.EventBuilt, a.ID, 5*time.Minute)
		d := arrived.Sub(t0)
		begun, ended := tw.span()
		build, _ := tb.last()
		spans := tw.lastSpans()
		ping, verify := spans.Took(agent.SpanPing), spans.Took(agent.SpanVerify)
		p := ownParts{
			events:   begun.Sub(t0) + arrived.Sub(ended),
			checkout: ended.Sub(begun) - build,
			ping:     ping, verify: verify,
		}
		p.own = p.events + p.checkout + p.ping + p.verify
		if p.events < 0 || p.checkout < 0 || p.own > d {
			b.Fatalf("ask %s: parts %+v do not fit in its %s", a.ID, p, d)
		}
		parts = append(parts, p)
		ev.wait(b, logFinal, a.ID, 10*time.Second)
		if cached, found := ev.cached(a.ID, " RUN "); !found || cached != warm {
			b.Fatalf("ask %s: the RUN step found %t, cached %t; want cached %t", a.ID, found, cached, warm)
		}
		return d
	}
	median := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	viaBuildctl := func(warm bool) time.Duration {
		cmd := exec.Command(buildctl, "--addr", addr, "build", "--progress", "plain",
			"--frontend", "dockerfile.v0",
			"--local", "context="+direct, "--local", "dockerfile="+direct,
			"--opt", "context:runtime=docker-image://"+base.Ref(),
			"--output", "type=image,name="+host+"/direct:latest,push=true,registry.insecure=true")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		t0 := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("buildctl build: %v\n%s", err, out.String())
		}
		d := time.Since(t0)
		if cached, found := stepCached(strings.Split(out.String(), "\n"), " RUN "); !found || cached != warm {
			b.Fatalf("buildctl: the RUN step found %t, cached %t; want cached %t\n%s", found, cached, warm, out.String())
		}
		return d
	}
	// measure alternates the two, the agent first on even runs.
	// before, when set, runs (unmeasured) before every build.
	measure := func(warm bool, prepare func(i int) string, before func()) (ratio float64, agentMed, directMed time.Duration, own ownParts) {
		var ag, di []time.Duration
		var ratios []float64
		parts = nil
		if before == nil {
			before = func() {}
		}
		agent := func(c string) { before(); ag = append(ag, viaAgent(c, warm)) }
		direct := func() { before(); di = append(di, viaBuildctl(warm)) }
		for i := range runs {
			c := prepare(i)
			if i%2 == 0 {
				agent(c)
				direct()
			} else {
				direct()
				agent(c)
			}
		}
		for i := range ag {
			ratios = append(ratios, float64(ag[i])/float64(di[i]))
		}
		slices.Sort(ratios)
		pick := func(f func(ownParts) time.Duration) time.Duration {
			var ds []time.Duration
			for _, p := range parts {
				ds = append(ds, f(p))
			}
			return median(ds)
		}
		own = ownParts{
			own:      pick(func(p ownParts) time.Duration { return p.own }),
			events:   pick(func(p ownParts) time.Duration { return p.events }),
			checkout: pick(func(p ownParts) time.Duration { return p.checkout }),
			ping:     pick(func(p ownParts) time.Duration { return p.ping }),
			verify:   pick(func(p ownParts) time.Duration { return p.verify }),
		}
		return ratios[len(ratios)/2], median(ag), median(di), own
	}

	// Unmeasured: the agent pulls the base and fills the cache, its
	// workspace clones the repository; buildctl finds the same content
	// cached (BuildKit's cache keys are by content).
	viaAgent(commit, false)
	viaBuildctl(true)

	// prune empties the daemon's build cache: the next build pulls the
	// base and runs every step again.
	prune := func() {
		if out, err := exec.Command(buildctl, "--addr", addr, "prune", "--all").CombinedOutput(); err != nil {
			b.Fatalf("buildctl prune: %v\n%s", err, out)
		}
	}
	var warmR, coldR, prunedR float64
	var warmA, warmD, coldA, coldD, prunedA, prunedD time.Duration
	var warmB, coldB, prunedB ownParts
	cold := 0
	// Fully cached: the ask as the controller makes it (cascade.Asks: its
	// registry build cache imported, and exported unless the registry holds
	// its input key's already — the same key each time, so after the first),
	// every step cached, the same commit each time. Each build is measured from publishing the
	// ask to its built arriving — the whole of it is overhead, no step
	// runs — through the default builder and, in turn, through one that
	// records every build in buildkitd's history (History, as before it
	// was off by default). After each build the push is verified again
	// the way it was before (a client of its own, no reuse: resolve, read
	// the index and the attestation manifest, tag, size), to time it
	// beside the verify span.
	bkHist, err := agent.NewBuildKit(addr, agent.BuildKitOptions{Registry: regc, History: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bkHist.Close() })
	cachedRuns := 4 * runs
	type cachedBuild struct {
		total, events, verifyBefore time.Duration
		spans                       agent.Spans
	}
	// fill builds the first, which fills the cache and is not checked.
	cachedAsk := func(history, fill bool) cachedBuild {
		n++
		id := fmt.Sprintf("overhead-%d", n)
		a := cascade.Asks(host, cascade.Submit{Plan: "p-bench", Module: "cached", AskID: id, Key: "cached-" + commit,
			Source: planner.Source{Repo: gitDir, Commit: commit, Path: "app"}})[0]
		a.Bases = []mesh.Base{base}
		if history {
			tb.use(bkHist)
		} else {
			tb.use(bk)
		}
		t0 := time.Now()
		publishAsk(b, js, a)
		arrived := ev.wait(b, mesh.EventBuilt, a.ID, 5*time.Minute)
		begun, ended := tw.span()
		c := cachedBuild{total: arrived.Sub(t0), events: begun.Sub(t0) + arrived.Sub(ended), spans: tw.lastSpans()}
		c.verifyBefore = verifyAsBefore(b, a.Image, tb.lastResult(), "latest")
		ev.wait(b, logFinal, a.ID, 10*time.Second)
		for _, step := range []string{" COPY ", " RUN "} {
			if fill {
				break
			}
			if cached, found := ev.cached(a.ID, step); !found || !cached {
				b.Fatalf("ask %s: the%s step found %t, cached %t; want it cached\n%s", a.ID, step, found, cached, strings.Join(ev.logs[a.ID], "\n"))
			}
		}
		return c
	}
	var cachedNow, cachedHist []cachedBuild
	for b.Loop() {
		warmR, warmA, warmD, warmB = measure(true, func(int) string { return commit }, nil)
		coldR, coldA, coldD, coldB = measure(false, func(int) string {
			cold++
			nonce := fmt.Sprintf("cold %d %d\n", cold, time.Now().UnixNano())
			if err := os.WriteFile(filepath.Join(direct, "nonce.txt"), []byte("direct "+nonce), 0o644); err != nil {
				b.Fatal(err)
			}
			return testenv.Commit(b, gitDir, map[string]string{"app/nonce.txt": "agent " + nonce})
		}, nil)
		// The same commit and files each time, the build cache emptied
		// before every build: a cold cache, no new source.
		last := testenv.Commit(b, gitDir, map[string]string{"app/nonce.txt": "pruned\n"})
		if err := os.WriteFile(filepath.Join(direct, "nonce.txt"), []byte("pruned\n"), 0o644); err != nil {
			b.Fatal(err)
		}
		viaAgent(last, false) // the clone fetches it once, unmeasured
		prunedR, prunedA, prunedD, prunedB = measure(false, func(int) string { return last }, prune)
		// Fully cached (cachedAsk), the two builders in turn.
		cachedAsk(false, true) // the first fills the registry cache, unmeasured
		for i := range cachedRuns {
			if i%2 == 0 {
				cachedNow = append(cachedNow, cachedAsk(false, false))
				cachedHist = append(cachedHist, cachedAsk(true, false))
			} else {
				cachedHist = append(cachedHist, cachedAsk(true, false))
				cachedNow = append(cachedNow, cachedAsk(false, false))
			}
		}
	}
	tb.use(bk)
	cachedMedian := func(cs []cachedBuild, f func(cachedBuild) time.Duration) float64 {
		var ds []time.Duration
		for _, c := range cs {
			ds = append(ds, f(c))
		}
		return ms(median(ds))
	}
	for _, k := range []struct {
		kind string
		cs   []cachedBuild
	}{{"cached", cachedNow}, {"cached-history", cachedHist}} {
		var totals []time.Duration
		for _, c := range k.cs {
			totals = append(totals, c.total)
		}
		slices.Sort(totals)
		b.ReportMetric(ms(quantile(totals, 0.50)), k.kind+"-p50-ms")
		b.ReportMetric(ms(quantile(totals, 0.90)), k.kind+"-p90-ms")
		b.ReportMetric(cachedMedian(k.cs, func(c cachedBuild) time.Duration { return c.events }), k.kind+"-events-ms")
		for _, span := range []string{agent.SpanCheckout, agent.SpanPing, agent.SpanSolve, agent.SpanCacheImport, agent.SpanExport, agent.SpanCacheExport, agent.SpanVerify} {
			b.ReportMetric(cachedMedian(k.cs, func(c cachedBuild) time.Duration { return c.spans.Took(span) }), k.kind+"-"+span+"-ms")
		}
		// The solve less its parts buildkitd reports: the frontend, the
		// session's transfers, the cache lookups, the history record.
		b.ReportMetric(cachedMedian(k.cs, func(c cachedBuild) time.Duration {
			return c.spans.Took(agent.SpanSolve) - c.spans.Took(agent.SpanCacheImport) - c.spans.Took(agent.SpanExport) - c.spans.Took(agent.SpanCacheExport)
		}), k.kind+"-solve-other-ms")
	}
	b.ReportMetric(cachedMedian(cachedNow, func(c cachedBuild) time.Duration { return c.verifyBefore }), "cached-verify-before-ms")
	b.ReportMetric(float64(len(cachedNow)), "cached-builds")

	for _, k := range []struct {
		kind         string
		ratio        float64
		agent, direc time.Duration
		own          ownParts
	}{
		{"warm", warmR, warmA, warmD, warmB},
		{"cold", coldR, coldA, coldD, coldB},
		{"pruned", prunedR, prunedA, prunedD, prunedB},
	} {
		b.ReportMetric(k.ratio, k.kind+"-agent/direct")
		b.ReportMetric(ms(k.agent), k.kind+"-agent-ms")
		b.ReportMetric(ms(k.direc), k.kind+"-direct-ms")
		b.ReportMetric(ms(k.own.own), k.kind+"-own-ms")
		b.ReportMetric(ms(k.own.events), k.kind+"-events-ms")
		b.ReportMetric(ms(k.own.checkout), k.kind+"-checkout-ms")
		b.ReportMetric(ms(k.own.ping), k.kind+"-ping-ms")
		b.ReportMetric(ms(k.own.verify), k.kind+"-verify-ms")
	}
	b.ReportMetric(float64(runs), "pairs")
}

// ownParts are the agent's own time on an ask and its parts.
type ownParts struct {
	own, events, checkout, ping, verify time.Duration
}

// timedWorker records when the last Work of the worker it wraps began and
// ended.
type timedWorker struct {
	w            agent.Worker
	mu           sync.Mutex
	begun, ended time.Time
	spans        agent.Spans
}

func (t *timedWorker) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	begun := time.Now()
	res, err := t.w.Work(ctx, a, log)
	ended := time.Now()
	t.mu.Lock()
	t.begun, t.ended, t.spans = begun, ended, res.Spans
	t.mu.Unlock()
	return res, err
}

// lastSpans are the last Work's spans, its checkout's among them.
func (t *timedWorker) lastSpans() agent.Spans {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.spans
}

func (t *timedWorker) span() (begun, ended time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.begun, t.ended
}

// timedBuilder times each Build of the builder it wraps and keeps the
// reference it pushed.
type timedBuilder struct {
	b   agent.Builder
	mu  sync.Mutex
	d   time.Duration
	ref string
	res agent.Result
}

func (t *timedBuilder) Build(ctx context.Context, req agent.BuildRequest) (agent.Result, error) {
	t.mu.Lock()
	b := t.b
	t.mu.Unlock()
	t0 := time.Now()
	res, err := b.Build(ctx, req)
	t.mu.Lock()
	t.d, t.ref, t.res = time.Since(t0), res.Ref, res
	t.mu.Unlock()
	return res, err
}

// use makes b the builder the next builds go to.
func (t *timedBuilder) use(b agent.Builder) {
	t.mu.Lock()
	t.b = b
	t.mu.Unlock()
}

func (t *timedBuilder) last() (time.Duration, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.d, t.ref
}

func (t *timedBuilder) lastResult() agent.Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.res
}

// verifyAsBefore reads back an image pushed with attestations the way
// BuildKit.Build did before it verified in three round trips: one call
// after another, each starting afresh (a registry.Client of its own: its
// ping, then its request) — resolve the index, read it, read the
// attestation manifest, move the tag to the image, read the image's size.
// It returns how long that took.
func verifyAsBefore(tb testing.TB, repo string, res agent.Result, tag string) time.Duration {
	tb.Helper()
	if res.Attestations == nil || res.Attestations.Manifest == "" {
		tb.Fatalf("%s was pushed without attestations: %+v", res.Ref, res.Attestations)
	}
	ctx := context.Background()
	fresh := func() *registry.Client { return registry.NewClient(registry.WithInsecure(true)) }
	index := repo + "@" + res.Attestations.Index
	t0 := time.Now()
	for _, call := range []func() error{
		func() error { _, err := fresh().Resolve(ctx, index); return err },
		func() error { _, err := fresh().Get(ctx, index); return err },
		func() error { _, err := fresh().Get(ctx, repo+"@"+res.Attestations.Manifest); return err },
		func() error { return fresh().Tag(ctx, res.Ref, tag) },
		func() error { _, err := fresh().Size(ctx, res.Ref); return err },
	} {
		if err := call(); err != nil {
			tb.Fatal(err)
		}
	}
	return time.Since(t0)
}

// benchTiny: MESHBUILD_BENCH=tiny, which `make test` sets when it runs
// every benchmark once at a small size, so that the checks inside them
// keep running.
func benchTiny() bool { return os.Getenv("MESHBUILD_BENCH") == "tiny" }
