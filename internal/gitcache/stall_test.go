package gitcache_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/cgi"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// httpGit serves the repositories under root over git's smart http
// (git http-backend as a CGI, as a git server does) and returns the base
// URL.
func httpGit(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatal(err)
	}
	h := &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// A git server that stands still (stopped with SIGSTOP; here a proxy that
// holds every byte, its connections open) fails the fetch once it has
// sent nothing for the stall time, a fetch error naming the stall, instead
// of holding it (and the build or plan waiting on it) for as long as it
// stands still; so does the fetch's context ending, whatever the stall
// time. Answering again, it is fetched from.
func TestAFetchFromAServerThatStandsStillFails(t *testing.T) {
	dir, commit := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\n"})
	addr := httpGit(t, filepath.Dir(dir))
	fz := testenv.Freeze(t, addr)
	repo := "http://" + fz.Addr() + "/" + filepath.Base(dir)
	t.Setenv("GIT_HTTP_LOW_SPEED_TIME", "2") // the stall time, shortened
	c := &gitcache.Cache{Dir: t.TempDir()}

	fz.Freeze()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	_, _, err := c.Fetch(ctx, repo, commit)
	took := time.Since(began)
	if ctx.Err() != nil {
		t.Fatalf("the fetch from a server that stands still was still waiting after %s", took.Round(time.Second))
	}
	if !errors.Is(err, gitcache.ErrFetch) {
		t.Fatalf("fetch: %v, want ErrFetch", err)
	}
	t.Logf("failed after %s: %v", took.Round(100*time.Millisecond), err)

	// With no stall time (GIT_HTTP_LOW_SPEED_LIMIT=0), the fetch's
	// context ending ends it, git's helpers with it.
	t.Setenv("GIT_HTTP_LOW_SPEED_LIMIT", "0")
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, _, err := c.Fetch(ctx, repo, commit); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a fetch from a server that stands still succeeded")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the fetch went on 18 s after its context ended")
	}

	fz.Thaw()
	if _, full, err := c.Fetch(context.Background(), repo, commit); err != nil || full != commit {
		t.Fatalf("fetch once the server answers: %s, %v", full, err)
	}
}
