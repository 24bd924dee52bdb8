package gitcache_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// A commit that leaves a path alone gives it the same tree id; one that
// touches it, another. HEAD resolves to the newest commit, a hash to itself,
// and a path that is not a directory to "".
func TestTreeIdsFollowThePathNotTheCommit(t *testing.T) {
	const remote = "https://git.example/fleet.git"
	dir, c1 := testenv.GitRepo(t, map[string]string{"base/Dockerfile": "FROM scratch\n", "app/Dockerfile": "FROM base\n"})
	c := &gitcache.Cache{Dir: t.TempDir(), InsteadOf: map[string]string{remote: dir}}
	ctx := context.Background()
	paths := []string{"base", "app", "", "missing", "app/Dockerfile"}
	r1, err := c.Resolve(ctx, remote, c1, paths)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Commit != c1 || r1.Trees["base"] == "" || r1.Trees["app"] == "" || r1.Trees[""] == "" ||
		r1.Trees["missing"] != "" || r1.Trees["app/Dockerfile"] != "" {
		t.Fatalf("resolution %+v", r1)
	}
	c2 := testenv.Commit(t, dir, map[string]string{"base/README.md": "docs\n"})
	r2, err := c.Resolve(ctx, remote, "HEAD", paths)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Commit != c2 {
		t.Fatalf("HEAD resolved to %s, want %s", r2.Commit, c2)
	}
	if r2.Trees["app"] != r1.Trees["app"] {
		t.Errorf("app untouched, tree %s → %s", r1.Trees["app"], r2.Trees["app"])
	}
	if r2.Trees["base"] == r1.Trees["base"] || r2.Trees[""] == r1.Trees[""] {
		t.Errorf("base touched, tree unchanged: %+v %+v", r1, r2)
	}
	// The first commit again, from the clone (already there).
	if again, err := c.Resolve(ctx, remote, c1, []string{"base"}); err != nil || again.Trees["base"] != r1.Trees["base"] {
		t.Fatalf("again %+v %v", again, err)
	}
	if _, err := c.Resolve(ctx, remote, "no-such-branch", nil); !errors.Is(err, gitcache.ErrNotFound) {
		t.Fatalf("a missing ref: %v, want ErrNotFound", err)
	}
	if _, err := c.Resolve(ctx, remote, "--upload-pack=x", nil); err == nil {
		t.Fatal("an option as a commit was accepted")
	}
}

// A repository that cannot be fetched is ErrFetch (and not ErrNotFound);
// Changed lists the paths two resolved trees differ in.
func TestFetchFailuresAndChangedPaths(t *testing.T) {
	const remote = "https://git.example/fleet.git"
	dir, c1 := testenv.GitRepo(t, map[string]string{"base/Dockerfile": "FROM scratch\n", "app/Dockerfile": "FROM base\n"})
	c := &gitcache.Cache{Dir: t.TempDir(), InsteadOf: map[string]string{remote: dir}}
	ctx := context.Background()
	_, _, err := c.Fetch(ctx, "/nonexistent/repo.git", "HEAD")
	if !errors.Is(err, gitcache.ErrFetch) || errors.Is(err, gitcache.ErrNotFound) {
		t.Fatalf("fetching a missing repository: %v, want ErrFetch", err)
	}
	var ge *gitcache.Error
	if !errors.As(err, &ge) || ge.Stderr == "" {
		t.Errorf("the git error and what git said are not kept: %#v", err)
	}
	r1, err := c.Resolve(ctx, remote, c1, []string{""})
	if err != nil {
		t.Fatal(err)
	}
	c2 := testenv.Commit(t, dir, map[string]string{"base/README.md": "docs\n", "app/VERSION": "2\n"})
	r2, err := c.Resolve(ctx, remote, c2, []string{""})
	if err != nil {
		t.Fatal(err)
	}
	changed, err := c.Changed(ctx, remote, r1.Trees[""], r2.Trees[""])
	if err != nil || len(changed) != 2 || changed[0] != "app/VERSION" || changed[1] != "base/README.md" {
		t.Fatalf("changed %v (%v), want [app/VERSION base/README.md]", changed, err)
	}
	if _, err := c.Changed(ctx, remote, "HEAD", r2.Trees[""]); err == nil {
		t.Error("a ref was taken as a tree id")
	}
}

// A commit fetched by its hash is kept under FetchedRef, so that the next
// fetch offers it as held and is sent only what is new: a second commit
// that changes one file of many adds a few objects to the clone, not the
// whole history again.
func TestAFetchByHashIsSentOnlyWhatIsNew(t *testing.T) {
	files := map[string]string{}
	for i := range 300 {
		files[fmt.Sprintf("m%d/f", i)] = fmt.Sprintf("file %d\n", i)
	}
	dir, c1 := testenv.GitRepo(t, files)
	c := &gitcache.Cache{Dir: t.TempDir()}
	ctx := context.Background()
	clone, _, err := c.Fetch(ctx, dir, c1)
	if err != nil {
		t.Fatal(err)
	}
	before := objectsIn(t, clone)
	c2 := testenv.Commit(t, dir, map[string]string{"m1/f": "changed\n"})
	if _, full, err := c.Fetch(ctx, dir, c2); err != nil || full != c2 {
		t.Fatalf("fetch %s: %s, %v", c2, full, err)
	}
	if ref, err := gitcache.Git(ctx, clone, "rev-parse", gitcache.FetchedRef); err != nil || ref != c2 {
		t.Fatalf("%s = %q (%v), want %s", gitcache.FetchedRef, ref, err, c2)
	}
	if added := objectsIn(t, clone) - before; added > 10 {
		t.Errorf("a one-file commit added %d objects to a clone of %d: the whole history was sent again", added, before)
	}
}

// objectsIn is how many objects the clone stores, loose and packed
// (duplicates in several packs counted each time).
func objectsIn(t *testing.T, clone string) int {
	t.Helper()
	out, err := gitcache.Git(context.Background(), clone, "count-objects", "-v")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(l, ": ")
		if k == "count" || k == "in-pack" {
			x, _ := strconv.Atoi(v)
			n += x
		}
	}
	return n
}

// A cache of Depth 1 is sent a commit's tree, not the history behind it:
// a repository whose earlier commits held 300 other files is fetched as
// the one tree; the next commit is sent only what is new; a commit behind
// the tip is fetched by its hash, and from a server that hands out no
// hash (protocol v0 without allowReachableSHA1InWant) by the whole history
// of its refs, the clone unshallowed.
func TestAShallowCacheIsSentOneTreeNotTheHistory(t *testing.T) {
	old := map[string]string{}
	for i := range 300 {
		old[fmt.Sprintf("old%d/f", i)] = fmt.Sprintf("old file %d\n", i)
	}
	dir, c1 := testenv.GitRepo(t, old)
	for i := range 300 {
		if err := os.RemoveAll(filepath.Join(dir, fmt.Sprintf("old%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	c2 := testenv.Commit(t, dir, map[string]string{"app/f": "app\n"})
	ctx := context.Background()

	full := &gitcache.Cache{Dir: t.TempDir()}
	fclone, _, err := full.Fetch(ctx, dir, c2)
	if err != nil {
		t.Fatal(err)
	}
	shallow := &gitcache.Cache{Dir: t.TempDir(), Depth: 1}
	sclone, h, err := shallow.Fetch(ctx, dir, c2)
	if err != nil || h != c2 {
		t.Fatalf("shallow fetch of %s: %s, %v", c2, h, err)
	}
	nf, ns := objectsIn(t, fclone), objectsIn(t, sclone)
	t.Logf("objects: %d with the history, %d shallow", nf, ns)
	if ns > 10 || ns >= nf {
		t.Errorf("a shallow fetch of a one-file commit stored %d objects (the full clone %d): was the history sent?", ns, nf)
	}
	// What a build reads of it: the tree.
	out := t.TempDir()
	if w, err := gitcache.Archive(ctx, sclone, c2, out); err != nil || len(w.Empty)+len(w.LFS) != 0 {
		t.Fatalf("Archive: %v, %+v (want no empty directory, no LFS pointer)", err, w)
	}
	if b, err := os.ReadFile(filepath.Join(out, "app", "f")); err != nil || string(b) != "app\n" {
		t.Errorf("app/f of the shallow clone's checkout: %q, %v", b, err)
	}

	c3 := testenv.Commit(t, dir, map[string]string{"app/f": "app 3\n"})
	before := objectsIn(t, sclone)
	if _, h, err := shallow.Fetch(ctx, dir, c3); err != nil || h != c3 {
		t.Fatalf("shallow fetch of %s: %s, %v", c3, h, err)
	}
	if added := objectsIn(t, sclone) - before; added > 5 {
		t.Errorf("a one-file commit added %d objects to a shallow clone of %d", added, before)
	}
	// Behind the tip, by its hash.
	if _, h, err := shallow.Fetch(ctx, dir, c1); err != nil || h != c1 {
		t.Fatalf("shallow fetch of the first commit %s, behind the tip: %s, %v", c1, h, err)
	}

	// A server that hands out no hash: the refs, then the whole history.
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "protocol.version")
	t.Setenv("GIT_CONFIG_VALUE_0", "0")
	refusing := &gitcache.Cache{Dir: t.TempDir(), Depth: 1}
	if _, h, err := refusing.Fetch(ctx, dir, c2); err != nil || h != c2 {
		t.Fatalf("from a server that hands out no hash, the commit %s behind the tip: %s, %v", c2, h, err)
	}
	if _, h, err := refusing.Fetch(ctx, dir, "HEAD"); err != nil || h != c3 {
		t.Fatalf("HEAD from a server that hands out no hash: %s, %v; want %s", h, err, c3)
	}
}
