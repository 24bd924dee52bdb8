package agent_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

// These run the agent loop with the real BuildWorker: a git checkout, real
// buildkitd + runc, a real registry.

const realRepo = "https://git.example/real.git"

func realWorker(t *testing.T, bk, gitDir string) agent.Worker {
	t.Helper()
	b, err := agent.NewBuildKit(bk, agent.BuildKitOptions{Registry: registry.NewClient(registry.WithInsecure(true))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &agent.BuildWorker{
		Sources: &agent.Sources{Dir: t.TempDir(), InsteadOf: map[string]string{realRepo: gitDir}},
		Builder: b,
	}
}

func realAsk(id, commit, path, image string, bases ...mesh.Base) mesh.Ask {
	return mesh.Ask{Version: mesh.AskVersion, ID: id, Plan: "p1", Module: path,
		Source: mesh.Source{Repo: realRepo, Commit: commit, Path: path}, Image: image, Bases: bases}
}

// freeAddr reserves a loopback port and releases it for a server to take.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestRealBuildsReportTheRegistrysDigestAndTheirFailures(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := testenv.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	bb := testenv.Busybox(t, reg)
	repo, _ := name2(bb)
	git, commit := testenv.GitRepo(t, map[string]string{
		"app/Dockerfile":    "FROM busybox\nRUN echo hello > /hello\n",
		"broken/Dockerfile": "FROM busybox\nRUN echo about to fail && exit 3\n",
	})
	s, js := bus(t)
	startAgent(t, s, "m1", realWorker(t, bk, git), nil)
	base := mesh.Base{Module: "busybox", Image: repo, Digest: strings.TrimPrefix(bb, repo+"@")}
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
	if info := consumerInfo(t, js); info.NumPending+uint64(info.NumAckPending) != 0 || info.NumRedelivered != 0 {
		t.Fatalf("queue %+v: want empty, nothing redelivered", info)
	}
}

func TestARegistryOutageIsRetriedThenReported(t *testing.T) {
	testenv.RequireBuildkit(t)
	addr := freeAddr(t)
	bk := testenv.Buildkitd(t, addr)
	git, commit := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY Dockerfile /\n"})
	s, js := bus(t)
	startAgent(t, s, "m1", realWorker(t, bk, git), func(c *agent.Config) {
		c.MaxAttempts, c.RetryDelay, c.MaxRetryDelay = 4, time.Second, 2*time.Second
	})
	// The registry is down when the push comes, and back a moment later.
	submit(t, js, realAsk("outage", commit, "app", addr+"/app"))
	testenv.WaitFor(t, 30*time.Second, "the first attempt", func() bool { return len(events(t, js).Started) >= 1 })
	time.Sleep(500 * time.Millisecond)
	srv, err := registry.Serve(context.Background(), addr, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "built after the registry returned", func() bool { return len(events(t, js).Built) == 1 })
	r := events(t, js)
	if len(r.Failed) != 0 || len(r.Started) < 2 {
		t.Fatalf("started %d failed %+v: want a retry and no failure", len(r.Started), r.Failed)
	}
	// Gone for good: failed{infra} after the bound, nothing left queued.
	srv.Close()
	submit(t, js, realAsk("gone", commit, "app", addr+"/gone"))
	testenv.WaitFor(t, 90*time.Second, "failed{infra}", func() bool { return len(events(t, js).Failed) == 1 })
	f := events(t, js).Failed[0]
	if f.Reason != mesh.ReasonInfra || f.Attempt != 4 {
		t.Fatalf("failed %+v: want infra on attempt 4", f)
	}
	if info := consumerInfo(t, js); info.NumPending+uint64(info.NumAckPending) != 0 {
		t.Fatalf("left in the queue: %+v", info)
	}
}

func TestSIGTERMMidBuildHandsARealBuildToAnotherAgent(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := testenv.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	git, head := testenv.GitRepo(t, map[string]string{"slow/Dockerfile": "FROM busybox\nRUN sleep 4 && echo done > /done\n"})
	bb := testenv.Busybox(t, reg)
	repo, _ := name2(bb)
	s, js := bus(t)
	w := realWorker(t, bk, git)
	a1 := startAgent(t, s, "m1", w, func(c *agent.Config) { c.Grace = 300 * time.Millisecond })
	base := mesh.Base{Module: "busybox", Image: repo, Digest: strings.TrimPrefix(bb, repo+"@")}
	submit(t, js, realAsk("slow", head, "slow", reg+"/slow", base))
	testenv.WaitFor(t, 30*time.Second, "m1 to start", func() bool { return len(events(t, js).Started) == 1 })
	startAgent(t, s, "m2", realWorker(t, bk, git), nil)
	time.Sleep(time.Second) // mid-build
	stopped := time.Now()
	a1.cancel()
	testenv.WaitFor(t, testAckWait, "m2 to take the ask", func() bool {
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

// name2 splits repo@digest.
func name2(ref string) (repo, digest string) {
	repo, digest, _ = strings.Cut(ref, "@")
	return repo, digest
}
