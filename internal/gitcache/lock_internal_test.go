package gitcache

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/internal/testenv"
)

// TestAHeldCommitIsReadBesideAFetch: while the clone's lock is held (a
// fetch under way, which may take minutes), a commit the clone holds is
// resolved and its trees compared at once; a commit it lacks waits for the
// lock, and is fetched once the lock is let go.
func TestAHeldCommitIsReadBesideAFetch(t *testing.T) {
	const remote = "https://git.example/fleet.git"
	dir, c1 := testenv.GitRepo(t, map[string]string{"base/Dockerfile": "FROM scratch\n"})
	c := &Cache{Dir: t.TempDir(), InsteadOf: map[string]string{remote: dir}}
	ctx := context.Background()
	r1, err := c.Resolve(ctx, remote, c1, []string{"base", ""})
	if err != nil {
		t.Fatal(err)
	}
	c2 := testenv.Commit(t, dir, map[string]string{"base/README.md": "docs\n"})
	clone, err := c.Clone(remote)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := c.lock(ctx, clone)
	if err != nil {
		t.Fatal(err)
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()

	held := make(chan error, 1)
	go func() {
		r, err := c.Resolve(ctx, remote, c1, []string{"base"})
		if err == nil && r.Trees["base"] != r1.Trees["base"] {
			t.Errorf("base at %s: tree %s, want %s", c1, r.Trees["base"], r1.Trees["base"])
		}
		if err == nil {
			_, err = c.Changed(ctx, remote, r1.Trees[""], r1.Trees["base"])
		}
		held <- err
	}()
	select {
	case err := <-held:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("resolving a commit the clone holds waited for the clone's lock")
	}

	missing := make(chan error, 1)
	go func() {
		_, err := c.Resolve(ctx, remote, c2, []string{"base"})
		missing <- err
	}()
	select {
	case err := <-missing:
		t.Fatalf("a commit the clone lacks was resolved (%v) while its lock was held", err)
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	locked = false
	select {
	case err := <-missing:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the fetch did not go on once the lock was let go")
	}

	// A fetch that waits for the lock gives up when its context ends,
	// saying why.
	unlock, err = c.lock(ctx, clone)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Resolve(short, remote, "HEAD", []string{"base"})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "another fetch") {
		t.Fatalf("resolving HEAD while a fetch holds the clone: %v, want a deadline error naming the other fetch", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("gave up after %v, its context ended after 200ms", waited)
	}
}
