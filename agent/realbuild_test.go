package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	controlapi "github.com/moby/buildkit/api/services/control"
	"github.com/moby/buildkit/client"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// These run the agent loop with the real BuildWorker: a git checkout, real
// buildkitd + runc, a real registry.

const realRepo = "https://git.example/real.git"

// realBuildKit is the agent's BuildKit on buildkitd bk, pushing to a
// plain-http registry, closed when the test ends.
func realBuildKit(t testing.TB, bk string) *agent.BuildKit {
	t.Helper()
	b, err := agent.NewBuildKit(bk, agent.BuildKitOptions{Registry: registry.NewClient(registry.WithInsecure(true))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func realWorker(t testing.TB, bk, gitDir string) agent.Worker {
	t.Helper()
	b := realBuildKit(t, bk)
	return &agent.BuildWorker{
		Sources: &agent.Sources{Dir: t.TempDir(), InsteadOf: map[string]string{realRepo: gitDir}},
		Builder: b,
	}
}

func realAsk(id, commit, path, image string, bases ...mesh.Base) mesh.Ask {
	return mesh.Ask{Version: mesh.AskVersion, ID: id, Plan: "p1", Module: path,
		Source: mesh.Source{Repo: realRepo, Commit: commit, Path: path}, Image: image, Bases: bases}
}

func TestRealBuildsReportTheRegistrysDigestAndTheirFailures(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	base := busyboxBase(t, reg)
	git, commit := testenv.GitRepo(t, map[string]string{
		"app/Dockerfile":    "FROM busybox\nRUN echo hello > /hello\n",
		"broken/Dockerfile": "FROM busybox\nRUN echo about to fail && exit 3\n",
	})
	s, js := bus(t)
	startAgent(t, s, "m1", realWorker(t, bk, git), nil)
	submit(t, js, realAsk("app", commit, "app", reg+"/app", base))
	submit(t, js, realAsk("broken", commit, "broken", reg+"/broken", base))
	submit(t, js, realAsk("nocommit", strings.Repeat("f", 40), "app", reg+"/x", base))
	testenv.WaitFor(t, 60*time.Second, "three outcomes", func() bool { r := events(t, js); return len(r.Built)+len(r.Failed) == 3 })
	time.Sleep(2 * testAckWait)
	r := events(t, js)
	if len(r.Built) != 1 || len(r.Failed) != 2 {
		t.Fatalf("built %+v failed %+v", r.Built, r.Failed)
	}
	// The built digest is the one the registry serves.
	got, err := registry.NewClient(registry.WithInsecure(true)).Resolve(context.Background(), r.Built[0].Image)
	if err != nil || got != r.Built[0].Digest || r.Built[0].Image != reg+"/app@"+got {
		t.Fatalf("built %s / %s, registry says %s (%v)", r.Built[0].Image, r.Built[0].Digest, got, err)
	}
	for _, f := range r.Failed {
		switch f.Ask {
		case "broken":
			if f.Reason != mesh.ReasonBuild || !strings.Contains(f.Message, "exit code: 3") || !strings.Contains(strings.Join(f.Log, "\n"), "about to fail") {
				t.Errorf("broken: %+v", f)
			}
		case "nocommit":
			if f.Reason != mesh.ReasonSource {
				t.Errorf("a missing commit: %+v, want reason source", f)
			}
		}
	}
	if info := drained(t, js, 5*time.Second); info.NumRedelivered != 0 {
		t.Fatalf("queue %+v: want empty, nothing redelivered", info)
	}
}

// A registry the ask names, not the machine's — its base's, outside the
// mesh's registry — does not answer: the machine's probe (its BuildKit and
// the mesh's registry answer) finds nothing wrong with it, so the failure
// is the ask's. It is retried while the budget lasts, built when the
// registry returns, and failed{infra} once the budget is spent. (The mesh's
// own registry not answering is the machine's sickness:
// TestAMachineWhoseRegistryDoesNotAnswerStopsTakingAsks.)
func TestARegistryOutageIsRetriedThenReported(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	// The base's registry holds busybox, and is stopped.
	baseAddr, baseDir := testenv.FreeAddr(t), t.TempDir()
	srv, err := registry.Serve(context.Background(), baseAddr, baseDir)
	if err != nil {
		t.Fatal(err)
	}
	bb := testenv.Busybox(t, baseAddr)
	srv.Close()
	_, digest, _ := strings.Cut(bb, "@")
	base := mesh.Base{Module: "busybox", Image: baseAddr + "/busybox", Digest: digest}
	bk := testenv.Buildkitd(t, reg, baseAddr)
	git, commit := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM busybox\nCOPY Dockerfile /\n"})
	s, js := bus(t)
	ended := make(ends, 100)
	startObserved(t, s, "m1", realWorker(t, bk, git), func(c *agent.Config) {
		// Attempts at 0, 1s, 3s and 5s after the first failure: the
		// fourth is past the budget.
		c.RetryFor, c.RetryDelay, c.MaxRetryDelay = 4500*time.Millisecond, time.Second, 2*time.Second
	}, ended)
	// Down for the whole budget: failed{infra} after the bound, nothing
	// left queued, and the machine healthy all along.
	submit(t, js, realAsk("gone", commit, "app", reg+"/gone", base))
	if e := ended.next(t, agent.OutcomeRetried, 60*time.Second); e.Reason != mesh.ReasonInfra {
		t.Fatalf("first attempt: %+v, want retried for infra", e)
	}
	if st := status(t, js, "m1"); st.Health != agent.HealthHealthy {
		t.Fatalf("status %+v: want healthy (the registry that failed is the ask's, not the machine's)", st)
	}
	ended.next(t, agent.OutcomeFailed, 90*time.Second) // every End of gone is taken
	testenv.WaitFor(t, 10*time.Second, "failed{infra}", func() bool { return len(events(t, js).Failed) == 1 })
	f := events(t, js).Failed[0]
	if f.Reason != mesh.ReasonInfra || f.Attempt != 4 {
		t.Fatalf("failed %+v: want infra on attempt 4", f)
	}
	// The ask is terminated once its failed is out: the server may count
	// it a moment longer.
	testenv.WaitFor(t, 5*time.Second, "nothing left in the queue", func() bool {
		info := consumerInfo(t, js)
		return info.NumPending+uint64(info.NumAckPending) == 0
	})
	// Down when the build comes, and back once the first attempt has
	// failed on it and been given back to be retried: built.
	submit(t, js, realAsk("outage", commit, "app", reg+"/app", base))
	if e := ended.next(t, agent.OutcomeRetried, 60*time.Second); e.Reason != mesh.ReasonInfra {
		t.Fatalf("first attempt: %+v, want retried for infra", e)
	}
	srv, err = registry.Serve(context.Background(), baseAddr, baseDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	testenv.WaitFor(t, 60*time.Second, "built after the registry returned", func() bool { return len(events(t, js).Built) == 1 })
	r := events(t, js)
	starts := 0
	for _, e := range r.Started {
		if e.Ask == "outage" {
			starts++
		}
	}
	if len(r.Failed) != 1 || starts < 2 {
		t.Fatalf("outage started %d times, failed %+v: want a retry and no failure of outage", starts, r.Failed)
	}
}

func TestSIGTERMMidBuildHandsARealBuildToAnotherAgent(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	git, head := testenv.GitRepo(t, map[string]string{"slow/Dockerfile": "FROM busybox\nRUN echo sleeping && sleep 4 && echo done > /done\n"})
	base := busyboxBase(t, reg)
	// A 60 s ack wait against a hand-back expected within 10 s: the ask
	// cannot reach m2 by redelivery in that time.
	s, js := busAckWait(t, longAckWait)
	running := awaitOutput(t, s, "slow", " sleeping")
	w := realWorker(t, bk, git)
	a1 := startAgent(t, s, "m1", w, func(c *agent.Config) { c.Grace = 300 * time.Millisecond })
	submit(t, js, realAsk("slow", head, "slow", reg+"/slow", base))
	testenv.WaitFor(t, 30*time.Second, "m1 to start", func() bool { return len(events(t, js).Started) == 1 })
	startAgent(t, s, "m2", realWorker(t, bk, git), nil)
	select { // mid-build: the RUN is running on m1
	case <-running:
	case <-time.After(60 * time.Second):
		t.Fatal("the RUN step never ran")
	}
	stopped := time.Now()
	a1.cancel()
	testenv.WaitFor(t, 10*time.Second, "m2 to take the ask", func() bool {
		for _, e := range events(t, js).Started {
			if e.On == "m2" {
				return true
			}
		}
		return false
	})
	t.Logf("handed back and taken in %s", time.Since(stopped).Round(time.Millisecond))
	testenv.WaitFor(t, 60*time.Second, "built on m2", func() bool { return len(events(t, js).Built) == 1 })
	r := events(t, js)
	if r.Built[0].On != "m2" || len(r.Failed) != 0 {
		t.Fatalf("built %+v failed %+v", r.Built, r.Failed)
	}
}

// buildApp checks s out of src and builds it on b, in two minutes at
// most, as reg/app:latest on one base, busybox at baseRepo@baseDigest: the
// result and the build's log. A build that fails fails t, with its log.
func buildApp(t *testing.T, b *agent.BuildKit, src *agent.Sources, s mesh.Source, reg, baseRepo, baseDigest string) (agent.Result, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := src.Checkout(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Release(dir)
	var log []string
	res, err := b.Build(ctx, agent.BuildRequest{
		Ask:        mesh.Ask{Image: reg + "/app", Source: s, Platform: mesh.DefaultPlatform, Bases: []mesh.Base{{Module: "busybox", Image: baseRepo, Digest: baseDigest}}},
		ContextDir: dir, Tag: "latest", Log: func(l string) { log = append(log, l) },
	})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, strings.Join(log, "\n"))
	}
	return res, log
}

// busyboxBase pushes busybox to reg (testenv.Busybox): the base of an ask
// built FROM busybox, pinned to its digest.
func busyboxBase(t *testing.T, reg string) mesh.Base {
	t.Helper()
	repo, digest := name2(testenv.Busybox(t, reg))
	return mesh.Base{Module: "busybox", Image: repo, Digest: digest}
}

// name2 splits repo@digest.
func name2(ref string) (repo, digest string) {
	repo, digest, _ = strings.Cut(ref, "@")
	return repo, digest
}

// awaitOutput returns a channel closed when the build output of ask
// (log.<ask>) carries a line ending in suffix.
func awaitOutput(t *testing.T, s *server.Server, ask, suffix string) <-chan struct{} {
	t.Helper()
	nc, _ := natstest.Connect(t, s)
	seen := make(chan struct{})
	closed := false
	_, err := nc.Subscribe(mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.LogEvent(ask)), func(m *nats.Msg) {
		var b mesh.LogBatch
		if json.Unmarshal(m.Data, &b) != nil || closed {
			return
		}
		if slices.ContainsFunc(b.Lines, func(l string) bool { return strings.HasSuffix(l, suffix) }) {
			closed = true // the handler runs on one goroutine
			close(seen)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return seen
}

// activeBuilds counts the builds buildkitd at addr is running now, from its
// own build history.
func activeBuilds(t *testing.T, addr string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.New(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stream, err := c.ControlClient().ListenBuildHistory(ctx, &controlapi.BuildHistoryRequest{ActiveOnly: true, EarlyExit: true})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		ev, err := stream.Recv()
		if err != nil {
			break
		}
		if ev.Type == controlapi.BuildHistoryEventType_STARTED {
			n++
		}
	}
	return n
}

// A cancel reaches a running build: the agent stops it in buildkitd,
// announces failed{cancelled} long before the build would have ended, and
// nothing is pushed or announced built. With the agent's cancel handler
// disabled, or an agent that keeps building, the failed{cancelled} does not
// come within the bound (the RUN sleeps a minute) and the test fails.
func TestACancelledBuildStopsAndIsNeverPushedOrAnnouncedBuilt(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	base := busyboxBase(t, reg)
	git, head := testenv.GitRepo(t, map[string]string{"long/Dockerfile": "FROM busybox\nRUN echo sleeping && sleep 60 && echo done > /done\n"})
	s, js := busAckWait(t, longAckWait)
	running := awaitOutput(t, s, "cancelme", " sleeping")
	startAgent(t, s, "m1", realWorker(t, bk, git), nil)
	submit(t, js, realAsk("cancelme", head, "long", reg+"/long", base))
	select {
	case <-running:
	case <-time.After(60 * time.Second):
		t.Fatal("the RUN step never ran")
	}

	nc, _ := natstest.Connect(t, s)
	req, _ := json.Marshal(mesh.Cancel{Asks: []string{"cancelme", "not-here"}})
	cancelled := time.Now()
	reply, err := nc.Request(mesh.SeatToolSubject(mesh.BuildSeat, mesh.CancelTool), req, 5*time.Second)
	if err != nil {
		t.Fatalf("cancel: %v", err)
	}
	var mine mesh.Cancel
	if err := json.Unmarshal(reply.Data, &mine); err != nil || !slices.Equal(mine.Asks, []string{"cancelme"}) {
		t.Fatalf("cancel answered %s (%v): want the agent to claim cancelme only", reply.Data, err)
	}
	// Well before the minute's sleep would end.
	const bound = 15 * time.Second
	testenv.WaitFor(t, bound, "failed{cancelled}", func() bool { return len(events(t, js).Failed) == 1 })
	t.Logf("failed{cancelled} %s after the cancel", time.Since(cancelled).Round(time.Millisecond))
	// buildkitd itself stopped the build: nothing is left to push.
	testenv.WaitFor(t, bound, "buildkitd to stop the build", func() bool { return activeBuilds(t, bk) == 0 })

	r := events(t, js)
	if f := r.Failed[0]; f.Ask != "cancelme" || f.Reason != mesh.ReasonCancel || f.On != "m1" {
		t.Fatalf("failed %+v: want cancelme, reason cancelled, on m1", f)
	}
	if len(r.Built) != 0 {
		t.Fatalf("built %+v after a cancel", r.Built)
	}
	if got, err := registry.NewClient(registry.WithInsecure(true)).Resolve(context.Background(), reg+"/long:latest"); err == nil {
		t.Fatalf("the registry has %s/long:latest = %s: a cancelled build was pushed", reg, got)
	}
	// Settled for good: terminated, not left to be redelivered.
	if info := drained(t, js, 5*time.Second); info.NumRedelivered != 0 {
		t.Fatalf("queue %+v: want the cancelled ask settled", info)
	}
}

// The shipped heartbeat default — a third of the consumer's ack wait; 10 s
// against the holders' 30 s — keeps a build longer than the ack wait with
// its agent. The ratio is what ships, not the 30 s: with the real ack wait a
// build past it would make this test take a minute, so the consumer's ack
// wait is 2 s (the agent reads it and beats every 2/3 s) and the RUN sleeps
// 7 s, three ack waits and more. A second idle agent would take the ask if
// it were redelivered.
func TestTheDefaultHeartbeatKeepsABuildLongerThanTheAckWait(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	base := busyboxBase(t, reg)
	git, head := testenv.GitRepo(t, map[string]string{"long/Dockerfile": "FROM busybox\nRUN sleep 7 && echo done > /done\n"})
	s, js := bus(t)
	shipped := func(c *agent.Config) { c.Heartbeat = agent.DefaultConfig().Heartbeat }
	startAgent(t, s, "m1", realWorker(t, bk, git), shipped)
	startAgent(t, s, "m2", realWorker(t, bk, git), shipped)
	submit(t, js, realAsk("long", head, "long", reg+"/long", base))
	testenv.WaitFor(t, 90*time.Second, "built", func() bool { return len(events(t, js).Built) == 1 })
	r := events(t, js)
	if len(r.Started) != 1 || r.Started[0].Attempt != 1 || len(r.Failed) != 0 {
		t.Fatalf("started %+v failed %+v: want one attempt, no failure", r.Started, r.Failed)
	}
	if d := r.Built[0].Duration; d < 3*testAckWait {
		t.Fatalf("the build took %s: want longer than three ack waits (%s) for this to test anything", d, 3*testAckWait)
	}
	if info := drained(t, js, 5*time.Second); info.NumRedelivered != 0 {
		t.Fatalf("queue %+v: want nothing redelivered and the ask settled", info)
	}
}

// The operator's trial: two agents on their own buildkitds, one daemon
// killed. The sick agent stops taking asks and says why; the asks are all
// built by the healthy one, none failed (the sick one leaves the queue to
// the healthy one: it does not start their budgets); and when its daemon is
// back the sick agent takes asks again.
func TestAMachineWhoseBuildKitIsKilledStopsTakingAsks(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	sockDir, err := os.MkdirTemp("", "bk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	opts := buildkitd.Options{Socket: filepath.Join(sockDir, "s.sock"), Root: t.TempDir(), RegistryHosts: []string{reg}}
	bk1 := testenv.StartBuildkitd(t, opts)
	bk2 := testenv.Buildkitd(t, reg)
	git, commit := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY Dockerfile /\n"})
	s, js := bus(t)
	noBudget := func(c *agent.Config) { c.RetryFor = time.Minute }
	health := make(healthSeen, 10)
	startObserved(t, s, "sick", realWorker(t, bk1.Addr(), git), noBudget, health)
	if err := bk1.Stop(); err != nil {
		t.Fatal(err)
	}
	startAgent(t, s, "well", realWorker(t, bk2, git), noBudget)
	for i := range 3 {
		submit(t, js, realAsk(fmt.Sprintf("k%d", i), commit, "app", reg+"/app"))
	}
	testenv.WaitFor(t, 120*time.Second, "every ask built", func() bool { return len(events(t, js).Built) == 3 })
	r := events(t, js)
	if len(r.Failed) != 0 {
		t.Fatalf("failed %+v: want none (the sick machine's failures are not the asks')", r.Failed)
	}
	for _, b := range r.Built {
		if b.On != "well" {
			t.Errorf("%s built on %s, want well", b.Ask, b.On)
		}
	}
	if ok := <-health; ok {
		t.Fatal("the sick agent was told healthy first")
	}
	if st := status(t, js, "sick"); st.Health != agent.HealthUnhealthy || !strings.Contains(st.Why, "buildkitd") {
		t.Fatalf("sick status %+v: want unhealthy, naming buildkitd", st)
	}
	// Its daemon is back, at the same address: it probes, and takes asks.
	testenv.StartBuildkitd(t, opts)
	if ok := <-health; !ok {
		t.Fatal("want healthy once the daemon answers")
	}
	if st := status(t, js, "sick"); st.Health != agent.HealthHealthy {
		t.Fatalf("status %+v: want healthy", st)
	}
}

// A submodule of the build context is in the real build: COPY from it
// finds the files of the commit its gitlink pins (not its repository's
// newest), fetched from the url .gitmodules gives relative to the
// repository's — both rewritten to this machine's copies, as a mirror
// would be (--git-instead-of).
func TestARealBuildCopiesFromASubmodule(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	base := busyboxBase(t, reg)
	lib, libCommit := testenv.GitRepo(t, map[string]string{"lib.txt": "lib v1\n"})
	testenv.Commit(t, lib, map[string]string{"lib.txt": "lib v2\n"})
	git, _ := testenv.GitRepo(t, map[string]string{
		"app/Dockerfile": "FROM busybox\nCOPY vendor/lib/lib.txt /lib.txt\nRUN grep -qx 'lib v1' /lib.txt\n",
	})
	commit := testenv.Submodule(t, git, "app/vendor/lib", "../lib.git", libCommit)
	src := &agent.Sources{Dir: t.TempDir(), InsteadOf: map[string]string{realRepo: git, "https://git.example/lib.git": lib}}
	// The build's RUN fails unless the pinned commit's file is there.
	res, log := buildApp(t, realBuildKit(t, bk), src, mesh.Source{Repo: realRepo, Commit: commit, Path: "app"}, reg, base.Image, base.Digest)
	if res.Digest == "" {
		t.Fatalf("built nothing:\n%s", strings.Join(log, "\n"))
	}
}
