package agent_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

// A registry that answers 503 to the blob uploads of a push (its API root
// answers: the machine is healthy) fails the push as infrastructure: the
// ask is given back and retried within --retry-for, and built once the
// registry takes uploads again — never failed{push}. (Before, BuildKit's
// "unexpected status … 503" was read as the registry refusing the push.)
func TestARegistry5xxDuringAPushIsRetriedThenBuilt(t *testing.T) {
	testenv.RequireBuildkit(t)
	inner := registry.New(t.TempDir())
	var failing atomic.Bool
	failing.Store(true)
	var refused atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() && strings.Contains(r.URL.Path, "/blobs/uploads/") {
			refused.Add(1)
			http.Error(w, "upstream connect error", http.StatusServiceUnavailable)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	reg := strings.TrimPrefix(srv.URL, "http://")
	bk := testenv.Buildkitd(t, reg)
	git, commit := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY Dockerfile /\n"})
	s, js := bus(t)
	ended := make(ends, 100)
	startObserved(t, s, "m1", realWorker(t, bk, git), func(c *agent.Config) {
		c.RetryFor, c.RetryDelay, c.MaxRetryDelay = time.Minute, time.Second, 2*time.Second
	}, ended)
	submit(t, js, realAsk("flaky", commit, "app", reg+"/app"))
	e := ended.next(t, agent.OutcomeRetried, 90*time.Second)
	if e.Reason != mesh.ReasonInfra {
		t.Fatalf("first attempt: %+v, want retried for infra", e)
	}
	if refused.Load() == 0 {
		t.Fatal("no upload was answered 503: the test proves nothing")
	}
	if st := status(t, js, "m1"); st.Health != agent.HealthHealthy {
		t.Fatalf("status %+v: want healthy (the registry answers its API root)", st)
	}
	failing.Store(false)
	testenv.WaitFor(t, 90*time.Second, "built once the registry takes uploads", func() bool { return len(events(t, js).Built) == 1 })
	if r := events(t, js); len(r.Failed) != 0 {
		t.Fatalf("failed %+v: want none (a 5xx is retried, not failed{push})", r.Failed)
	}
}
