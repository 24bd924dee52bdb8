package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCheckout(t *testing.T) {
	ctx := context.Background()
	repo, c1 := testenv.GitRepo(t, map[string]string{
		"runtime/Dockerfile":   "FROM base\n",
		"runtime/app/main.txt": "v1",
		"other/Dockerfile":     "FROM x\n",
	})
	c2 := testenv.Commit(t, repo, map[string]string{"runtime/app/main.txt": "v2"})
	s := &Sources{Dir: t.TempDir()}

	// An older commit than the tip, then the tip; each its own directory
	// holding only the path.
	dir1, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c1, Path: "runtime"})
	if err != nil {
		t.Fatal(err)
	}
	dir2, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c2, Path: "runtime/", Dockerfile: "./Dockerfile"})
	if err != nil {
		t.Fatal(err)
	}
	if dir1 == dir2 {
		t.Fatal("two checkouts share a directory")
	}
	if got := readFile(t, filepath.Join(dir1, "app", "main.txt")); got != "v1" {
		t.Errorf("commit 1: main.txt = %q", got)
	}
	if got := readFile(t, filepath.Join(dir2, "app", "main.txt")); got != "v2" {
		t.Errorf("commit 2: main.txt = %q", got)
	}
	if got := readFile(t, filepath.Join(dir1, "Dockerfile")); got != "FROM base\n" {
		t.Errorf("Dockerfile = %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir1, "other")); !os.IsNotExist(err) {
		t.Errorf("checkout holds more than the path: %v", err)
	}

	// The whole repository when the path is empty.
	root, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c2, Dockerfile: "other/Dockerfile"})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "runtime", "app", "main.txt")); got != "v2" {
		t.Errorf("root checkout: main.txt = %q", got)
	}

	s.KeepTrees = -1 // each removed as it is released
	for _, d := range []string{dir1, dir2, root} {
		if err := s.Release(d); err != nil {
			t.Errorf("Release(%s): %v", d, err)
		}
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there after Release", d)
		}
	}
	if err := s.Release(t.TempDir()); err == nil {
		t.Error("Release of a directory Checkout did not make: no error")
	}
	entries, _ := os.ReadDir(filepath.Join(s.Dir, "repos"))
	if len(entries) != 1 {
		t.Errorf("%d clones for one repository", len(entries))
	}
}

// TestADockerfileBesideTheContext: a Dockerfile that climbs out of the
// build context (`docker build -f docker/app.Dockerfile app`) is found at
// the commit; the context's checkout holds the context alone, and
// DockerfileDir writes the Dockerfile's directory (with its
// .dockerignore) beside it. A Dockerfile in the context has none.
func TestADockerfileBesideTheContext(t *testing.T) {
	ctx := context.Background()
	repo, c := testenv.GitRepo(t, map[string]string{
		"app/app.txt":                        "app\n",
		"app/Dockerfile":                     "FROM scratch\n",
		"docker/app.Dockerfile":              "FROM base\nCOPY app.txt /\n",
		"docker/app.Dockerfile.dockerignore": "*.md\n",
	})
	s := &Sources{Dir: t.TempDir(), KeepTrees: -1}
	src := mesh.Source{Repo: repo, Commit: c, Path: "app", Dockerfile: "../docker/app.Dockerfile"}
	dir, commit, err := s.CheckoutCommit(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "app.txt")); got != "app\n" {
		t.Errorf("the context's app.txt = %q", got)
	}
	dfDir, err := s.DockerfileDir(ctx, src, commit)
	if err != nil || dfDir == "" {
		t.Fatalf("DockerfileDir = %q, %v; want the directory of docker/app.Dockerfile", dfDir, err)
	}
	if got := readFile(t, filepath.Join(dfDir, "app.Dockerfile")); got != "FROM base\nCOPY app.txt /\n" {
		t.Errorf("app.Dockerfile = %q", got)
	}
	if got := readFile(t, filepath.Join(dfDir, "app.Dockerfile.dockerignore")); got != "*.md\n" {
		t.Errorf("its .dockerignore = %q", got)
	}
	inside := mesh.Source{Repo: repo, Commit: c, Path: "app"}
	if d, err := s.DockerfileDir(ctx, inside, commit); d != "" || err != nil {
		t.Errorf("DockerfileDir of a Dockerfile in its context = %q, %v; want none", d, err)
	}
	for _, d := range []string{dir, dfDir} {
		if err := s.Release(d); err != nil {
			t.Errorf("Release(%s): %v", d, err)
		}
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there after Release", d)
		}
	}
}

// A tree is written once for every build of it: a second checkout of the
// same tree (another commit that left the path alone, or a build of it at
// once with the first) gets the same directory, which stays until the
// last build releases it; a released tree is kept for the next build of
// it, the KeepTrees most recently released, and the rest removed.
func TestACheckoutIsKeptForTheNextBuildOfItsTree(t *testing.T) {
	ctx := context.Background()
	repo, c1 := testenv.GitRepo(t, map[string]string{"a/Dockerfile": "FROM base\n", "b/Dockerfile": "FROM x\n", "c/Dockerfile": "FROM y\n"})
	c2 := testenv.Commit(t, repo, map[string]string{"b/Dockerfile": "FROM z\n"})
	s := &Sources{Dir: t.TempDir(), KeepTrees: 1}
	checkout := func(commit, path string) string {
		t.Helper()
		dir, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: commit, Path: path})
		if err != nil {
			t.Fatal(err)
		}
		return dir
	}
	release := func(dir string) {
		t.Helper()
		if err := s.Release(dir); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(dir string) bool { _, err := os.Stat(dir); return err == nil }

	a1, a2 := checkout(c1, "a"), checkout(c2, "a") // c2 left a/ alone
	if a1 != a2 {
		t.Fatalf("one tree checked out twice: %s and %s", a1, a2)
	}
	b1, b2 := checkout(c1, "b"), checkout(c2, "b")
	if b1 == b2 {
		t.Fatal("two trees share a directory")
	}
	if got := readFile(t, filepath.Join(b2, "Dockerfile")); got != "FROM z\n" {
		t.Errorf("b at c2: Dockerfile = %q", got)
	}
	release(a1)
	if !exists(a2) {
		t.Fatal("a tree a build still uses was removed")
	}
	release(a2)
	release(b1)
	release(b2) // the most recent: kept; a and b at c1 are removed
	if exists(a1) || exists(b1) || !exists(b2) {
		t.Errorf("after the releases: a kept %v, b@c1 kept %v, b@c2 kept %v; want only b@c2 (KeepTrees 1)", exists(a1), exists(b1), exists(b2))
	}
	if again := checkout(c2, "b"); again != b2 || readFile(t, filepath.Join(again, "Dockerfile")) != "FROM z\n" {
		t.Errorf("the kept tree checked out again at %s, want %s", again, b2)
	}
	if err := s.Release(a1); err == nil {
		t.Error("Release of a checkout already removed: no error")
	}
}

// A checkout an earlier process left half written under a tree's name is
// written again, not used as it is.
func TestACheckoutLeftByAnEarlierProcessIsWrittenAgain(t *testing.T) {
	ctx := context.Background()
	repo, c := testenv.GitRepo(t, map[string]string{"Dockerfile": "FROM base\n", "app/main.txt": "v1"})
	dir := t.TempDir()
	first := &Sources{Dir: dir}
	d, err := first.Checkout(ctx, mesh.Source{Repo: repo, Commit: c})
	if err != nil {
		t.Fatal(err)
	}
	// The process stops half way: a file gone, a stray one written.
	os.Remove(filepath.Join(d, "app", "main.txt"))
	os.WriteFile(filepath.Join(d, "stray"), []byte("x"), 0o644)

	again := &Sources{Dir: dir}
	d2, err := again.Checkout(ctx, mesh.Source{Repo: repo, Commit: c})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release(d2)
	if got := readFile(t, filepath.Join(d2, "app", "main.txt")); got != "v1" {
		t.Errorf("main.txt = %q", got)
	}
	if _, err := os.Stat(filepath.Join(d2, "stray")); !os.IsNotExist(err) {
		t.Errorf("the earlier process's stray file is in the checkout: %v", err)
	}
}

// The checkouts an earlier process left (of trees not asked for again, in
// the layout of any version) are removed before the first checkout.
func TestCheckoutsAnEarlierProcessLeftAreRemoved(t *testing.T) {
	ctx := context.Background()
	repo, c := testenv.GitRepo(t, map[string]string{"Dockerfile": "FROM base\n"})
	dir := t.TempDir()
	left := []string{filepath.Join(dir, "work", "tree-0123", "context"), filepath.Join(dir, "work", "ask-123", "context")}
	for _, l := range left {
		if err := os.MkdirAll(l, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := &Sources{Dir: dir}
	d, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(d)
	for _, l := range left {
		if _, err := os.Stat(filepath.Dir(l)); !os.IsNotExist(err) {
			t.Errorf("%s left by an earlier process is still there (%v)", filepath.Dir(l), err)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "work"))
	if len(entries) != 1 {
		t.Errorf("work/ holds %d entries, want the one checkout", len(entries))
	}
}

// A commit the clone has is not fetched again: it checks out with the
// repository gone. A commit it lacks is.
func TestCheckoutFetchesOnlyWhenMissing(t *testing.T) {
	ctx := context.Background()
	repo, c1 := testenv.GitRepo(t, map[string]string{"Dockerfile": "FROM base\n"})
	s := &Sources{Dir: t.TempDir()}
	src := mesh.Source{Repo: repo, Commit: c1}
	if _, err := s.Checkout(ctx, src); err != nil {
		t.Fatal(err)
	}
	c2 := testenv.Commit(t, repo, map[string]string{"Dockerfile": "FROM other\n"})

	moved := repo + ".away"
	if err := os.Rename(repo, moved); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkout(ctx, src); err != nil {
		t.Fatalf("a commit in the clone, repository gone: %v", err)
	}
	if _, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c2}); !errors.Is(err, ErrSource) {
		t.Fatalf("a new commit, repository gone: %v, want ErrSource", err)
	}
	if err := os.Rename(moved, repo); err != nil {
		t.Fatal(err)
	}
	dir, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c2})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "Dockerfile")); got != "FROM other\n" {
		t.Errorf("Dockerfile = %q", got)
	}
}

// An ask that names its context's tree is built from a clone that holds
// that tree without fetching the commit: a new commit that left the
// module's sources alone builds with the repository out of reach. A tree
// the clone does not hold is fetched and checked against the commit.
func TestCheckoutOfAHeldTreeFetchesNothing(t *testing.T) {
	ctx := context.Background()
	repo, c1 := testenv.GitRepo(t, map[string]string{"a/Dockerfile": "FROM base\n", "b/Dockerfile": "FROM x\n"})
	c2 := testenv.Commit(t, repo, map[string]string{"b/Dockerfile": "FROM z\n"}) // a/ as it was
	a, b2 := gitTree(t, repo, c2, "a"), gitTree(t, repo, c2, "b")
	s := &Sources{Dir: t.TempDir(), KeepTrees: -1} // nothing kept: every checkout written again
	d1, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c1, Path: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(d1); err != nil {
		t.Fatal(err)
	}
	moved := repo + ".away"
	if err := os.Rename(repo, moved); err != nil {
		t.Fatal(err)
	}
	dir, commit, err := s.CheckoutCommit(ctx, mesh.Source{Repo: repo, Commit: c2, Path: "a", Tree: a})
	if err != nil {
		t.Fatalf("a new commit whose tree the clone holds, the repository gone: %v", err)
	}
	if got := readFile(t, filepath.Join(dir, "Dockerfile")); got != "FROM base\n" || commit != c2 {
		t.Errorf("checked out %q at %s, want FROM base at %s", got, commit, c2)
	}
	if _, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c2, Path: "b", Tree: b2}); !errors.Is(err, ErrSource) {
		t.Fatalf("a tree the clone does not hold, the repository gone: %v, want ErrSource (the fetch failed)", err)
	}
	if err := os.Rename(moved, repo); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c2, Path: "b", Tree: strings.Repeat("ab", 20)}); !errors.Is(err, ErrSource) || !strings.Contains(err.Error(), "names tree") {
		t.Fatalf("an ask naming another tree than its commit's: %v, want ErrSource naming the trees", err)
	}
	dir, err = s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c2, Path: "b", Tree: b2})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "Dockerfile")); got != "FROM z\n" {
		t.Errorf("b at c2: Dockerfile = %q", got)
	}
}

func TestCheckoutInsteadOf(t *testing.T) {
	repo, c := testenv.GitRepo(t, map[string]string{"runtime/Dockerfile": "FROM base\n"})
	s := &Sources{Dir: t.TempDir(), InsteadOf: map[string]string{
		"https://git.example/":          "/nonexistent/",
		"https://git.example/fleet.git": repo,
	}}
	dir, err := s.Checkout(context.Background(), mesh.Source{Repo: "https://git.example/fleet.git", Commit: c, Path: "runtime"})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "Dockerfile")); got != "FROM base\n" {
		t.Errorf("Dockerfile = %q", got)
	}
}

// A repository or commit the controller read (the ask names its tree)
// missing from this machine's own mirror of it (--git-instead-of) is this
// machine's trouble, not the ask's: ErrInfra, handed back for another
// machine, naming the mirror. Without a rewrite (TestCheckoutErrors), or
// for an ask that names no tree, the same misses are ErrSource.
func TestAMirrorThatLacksTheSourceIsThisMachinesTrouble(t *testing.T) {
	repo, c := testenv.GitRepo(t, map[string]string{"runtime/Dockerfile": "FROM base\n"})
	tree := gitTree(t, repo, c, "runtime")
	stale, _ := testenv.GitRepo(t, map[string]string{"Dockerfile": "FROM other\n"})
	missing := filepath.Join(t.TempDir(), "nope.git")
	for _, tc := range []struct {
		name, mirror string
	}{
		{"the mirror is not there", missing},
		{"the mirror lacks the commit", stale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Sources{Dir: t.TempDir(), InsteadOf: map[string]string{"https://git.example/fleet.git": tc.mirror}}
			_, err := s.Checkout(context.Background(), mesh.Source{Repo: "https://git.example/fleet.git", Commit: c, Path: "runtime", Tree: tree})
			if !errors.Is(err, ErrInfra) || errors.Is(err, ErrSource) || Classify(err) != mesh.ReasonInfra {
				t.Fatalf("Checkout from a mirror that lacks it: %v, want ErrInfra", err)
			}
			if !strings.Contains(err.Error(), tc.mirror) || !strings.Contains(err.Error(), "mirror") {
				t.Errorf("error %q does not name this machine's mirror %s", err, tc.mirror)
			}
			// An ask that names no tree: nothing says the commit is
			// anywhere, the ask's own source failure.
			_, err = s.Checkout(context.Background(), mesh.Source{Repo: "https://git.example/fleet.git", Commit: c, Path: "runtime"})
			if !errors.Is(err, ErrSource) {
				t.Errorf("Checkout naming no tree from a mirror that lacks it: %v, want ErrSource", err)
			}
		})
	}
	// The mirror mended, the same ask builds.
	s := &Sources{Dir: t.TempDir(), InsteadOf: map[string]string{"https://git.example/fleet.git": repo}}
	if _, err := s.Checkout(context.Background(), mesh.Source{Repo: "https://git.example/fleet.git", Commit: c, Path: "runtime", Tree: tree}); err != nil {
		t.Fatal(err)
	}
}

// A commit named by a branch is fetched anew every time.
func TestCheckoutBranch(t *testing.T) {
	ctx := context.Background()
	repo, _ := testenv.GitRepo(t, map[string]string{"Dockerfile": "FROM one\n"})
	s := &Sources{Dir: t.TempDir()}
	if _, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: "main"}); err != nil {
		t.Fatal(err)
	}
	testenv.Commit(t, repo, map[string]string{"Dockerfile": "FROM two\n"})
	dir, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: "main"})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "Dockerfile")); got != "FROM two\n" {
		t.Errorf("Dockerfile = %q, want the branch's new tip", got)
	}
}

func TestCheckoutErrors(t *testing.T) {
	repo, c := testenv.GitRepo(t, map[string]string{"runtime/Dockerfile": "FROM base\n", "file": "x"})
	notRepo := t.TempDir()
	closed := testenv.ClosedAddr(t)
	missing := strings.Repeat("0", 40)

	for _, tc := range []struct {
		name string
		src  mesh.Source
		want error
		msg  string
	}{
		{"commit not found", mesh.Source{Repo: repo, Commit: missing}, ErrSource, "commit " + missing + " not found"},
		{"ref not found", mesh.Source{Repo: repo, Commit: "no-such-branch"}, ErrSource, "not found"},
		{"repository not found", mesh.Source{Repo: filepath.Join(notRepo, "nope.git"), Commit: c}, ErrSource, "not found"},
		{"not a repository", mesh.Source{Repo: notRepo, Commit: c}, ErrSource, "not a git repository"},
		{"path missing", mesh.Source{Repo: repo, Commit: c, Path: "nope"}, ErrSource, `path "nope"`},
		{"path is a file", mesh.Source{Repo: repo, Commit: c, Path: "file"}, ErrSource, `path "file"`},
		{"Dockerfile missing", mesh.Source{Repo: repo, Commit: c, Path: "runtime", Dockerfile: "Other"}, ErrSource, `Dockerfile "runtime/Other" not found`},
		{"no Dockerfile at the root", mesh.Source{Repo: repo, Commit: c}, ErrSource, `Dockerfile "Dockerfile" not found`},
		{"path leaves the repository", mesh.Source{Repo: repo, Commit: c, Path: "runtime/../.."}, ErrSource, "leaves"},
		{"Dockerfile leaves the repository", mesh.Source{Repo: repo, Commit: c, Path: "runtime", Dockerfile: "../../file"}, ErrSource, `"../../file" leaves the repository`},
		{"Dockerfile beside the context missing", mesh.Source{Repo: repo, Commit: c, Path: "runtime", Dockerfile: "../docker/Dockerfile"}, ErrSource, `Dockerfile "docker/Dockerfile" not found`},
		{"commit is an option", mesh.Source{Repo: repo, Commit: "--upload-pack=touch /tmp/pwned"}, ErrSource, "not a commit"},
		{"repo is an option", mesh.Source{Repo: "--help", Commit: c}, ErrSource, "not a repository"},
		// git's own words on why, not only what failed (by hand: a farm
		// whose machine could not resolve the repository's host said
		// "infra: fetching https://git.example/fleet.git" and no more).
		{"server unreachable", mesh.Source{Repo: "http://" + closed + "/fleet.git", Commit: c}, ErrInfra, "fetching http://" + closed + "/fleet.git: fatal: unable to access"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Sources{Dir: t.TempDir()}
			dir, err := s.Checkout(context.Background(), tc.src)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Checkout = %q, %v; want %v", dir, err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
			if entries, _ := os.ReadDir(filepath.Join(s.Dir, "work")); len(entries) != 0 {
				t.Errorf("a failed checkout left %d entries in work/", len(entries))
			}
		})
	}
}

func TestCheckoutCancelled(t *testing.T) {
	repo, c := testenv.GitRepo(t, map[string]string{"Dockerfile": "FROM base\n"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := &Sources{Dir: t.TempDir()}
	_, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: c})
	if got := Classify(err); got != mesh.ReasonCancel {
		t.Errorf("Classify(%v) = %q, want %q", err, got, mesh.ReasonCancel)
	}
}

// Slots checking out the same repository at once share its clone safely.
func TestCheckoutConcurrent(t *testing.T) {
	ctx := context.Background()
	repo, c1 := testenv.GitRepo(t, map[string]string{"Dockerfile": "FROM base\n", "n": "1"})
	commits := []string{c1}
	for i := 2; i <= 4; i++ {
		commits = append(commits, testenv.Commit(t, repo, map[string]string{"n": fmt.Sprint(i)}))
	}
	s := &Sources{Dir: t.TempDir()}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := i%len(commits) + 1
			dir, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: commits[n-1]})
			if err != nil {
				errs <- err
				return
			}
			defer s.Release(dir)
			b, err := os.ReadFile(filepath.Join(dir, "n"))
			if err != nil || string(b) != fmt.Sprint(n) {
				errs <- fmt.Errorf("checkout of commit %d holds n=%q (%v)", n, b, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{classified(ErrSource, "x", nil), mesh.ReasonSource},
		{fmt.Errorf("wrapped: %w", classified(ErrBuild, "x", errors.New("y"))), mesh.ReasonBuild},
		{classified(ErrPush, "x", nil), mesh.ReasonPush},
		{classified(ErrInfra, "x", nil), mesh.ReasonInfra},
		{fmt.Errorf("%w: bad", mesh.ErrMalformedAsk), mesh.ReasonAsk},
		{context.Canceled, mesh.ReasonCancel},
		{errors.New("something else"), mesh.ReasonInfra},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	inner := errors.New("cause")
	err := classified(ErrBuild, "RUN failed", inner)
	if !errors.Is(err, inner) || err.Error() != "build: RUN failed" {
		t.Errorf("Error: %q, Is(cause) %v", err, errors.Is(err, inner))
	}
}

func TestCheckoutCommitResolvesARef(t *testing.T) {
	repo, _ := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\n"})
	head := testenv.Commit(t, repo, map[string]string{"app/VERSION": "2\n"})
	s := &Sources{Dir: t.TempDir()}
	dir, commit, err := s.CheckoutCommit(context.Background(), mesh.Source{Repo: repo, Commit: "HEAD", Path: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(dir)
	if commit != head {
		t.Fatalf("HEAD resolved to %s, want %s", commit, head)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "VERSION")); err != nil || string(data) != "2\n" {
		t.Fatalf("checked out %q %v", data, err)
	}
}

func TestCheckoutKeepsModesAndLinks(t *testing.T) {
	repo, _ := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\n", "app/run.sh": "#!/bin/sh\necho hi\n", "app/sub/deep.txt": "deep\n"})
	if err := os.Chmod(filepath.Join(repo, "app/run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/deep.txt", filepath.Join(repo, "app/link")); err != nil {
		t.Fatal(err)
	}
	head := testenv.Commit(t, repo, nil)
	s := &Sources{Dir: t.TempDir()}
	dir, err := s.Checkout(context.Background(), mesh.Source{Repo: repo, Commit: head, Path: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(dir)
	if fi, err := os.Stat(filepath.Join(dir, "run.sh")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("run.sh lost its executable bit: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "link")); err != nil || target != "sub/deep.txt" {
		t.Errorf("link: %q %v", target, err)
	}
	if got := readFile(t, filepath.Join(dir, "sub/deep.txt")); got != "deep\n" {
		t.Errorf("deep.txt = %q", got)
	}
}

// gitTree is the tree of path at commit in repo (its object name), as the
// controller names it in an ask.
func gitTree(t *testing.T, repo, commit, path string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", repo, "rev-parse", commit+":"+path).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// builderFunc is a Builder of a function (pure logic: what the worker
// hands the build).
type builderFunc func(ctx context.Context, req BuildRequest) (Result, error)

func (f builderFunc) Build(ctx context.Context, req BuildRequest) (Result, error) { return f(ctx, req) }

// TestASubmoduleWithoutAURLIsSaidInTheBuildLog: a gitlink that
// .gitmodules gives no url for (none at all here) cannot be fetched, and
// git writes its directory empty, so a build that copies from it would not
// find its files with nothing to say why: the checkout names it, and the
// worker says so in the build's log, once for each, also when the checkout
// is kept for the next build of its tree. A context without any says
// nothing.
func TestASubmoduleWithoutAURLIsSaidInTheBuildLog(t *testing.T) {
	ctx := context.Background()
	repo, _ := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY . /\n", "app/a.txt": "a", "other/Dockerfile": "FROM scratch\n"})
	commit := testenv.Submodule(t, repo, "app/vendor/lib", "", strings.Repeat("c", 40))
	s := &Sources{Dir: t.TempDir()}
	var lines []string
	var built []string
	w := &BuildWorker{Sources: s, Builder: builderFunc(func(_ context.Context, req BuildRequest) (Result, error) {
		built = append(built, req.ContextDir)
		if fi, err := os.Stat(filepath.Join(req.ContextDir, "vendor", "lib")); req.Module == "app" && (err != nil || !fi.IsDir()) {
			t.Errorf("the submodule's directory in the context: %v", err)
		}
		return Result{Digest: "sha256:" + strings.Repeat("d", 64)}, nil
	})}
	// app twice: the second from the checkout the first left.
	for _, path := range []string{"app", "other", "app"} {
		lines = nil
		ask := mesh.Ask{Module: path, Image: "reg.example/" + path, Source: mesh.Source{Repo: repo, Commit: commit, Path: path}}
		if _, err := w.Work(ctx, ask, func(l string) { lines = append(lines, l) }); err != nil {
			t.Fatal(err)
		}
		var said []string
		for _, l := range lines {
			if strings.Contains(l, "submodule") {
				said = append(said, l)
			}
		}
		want := 0
		if path == "app" {
			want = 1
		}
		if len(said) != want || want == 1 && !strings.HasPrefix(said[0], "source: vendor/lib in the build context is a git submodule that .gitmodules gives no url for, which is not fetched") {
			t.Errorf("%s's build log on submodules: %q, want %d line naming vendor/lib", path, said, want)
		}
	}
	if len(built) != 3 || built[0] != built[2] {
		t.Fatalf("built %q, want 3 builds, app's twice from one checkout", built)
	}
}

// TestSubmodulesAreFetchedIntoTheContext: a submodule in the build
// context is checked out at the commit its gitlink pins, from the url
// .gitmodules gives (relative to the repository, as git resolves it), and
// so is a submodule within it, as docker build of a git context does; the
// worker names each with its url and commit. One at a commit its
// repository lacks, or whose repository is not there, fails the checkout
// as a source error naming it; and nothing of the failed checkout is kept.
func TestSubmodulesAreFetchedIntoTheContext(t *testing.T) {
	ctx := context.Background()
	inner, innerCommit := testenv.GitRepo(t, map[string]string{"inner.txt": "inner"})
	lib, _ := testenv.GitRepo(t, map[string]string{"lib.txt": "lib v1", "big.bin": lfsPointer})
	// Each repository is a directory of the test's own temporary one:
	// "../<name>" is a sibling, as "../lib.git" is beside fleet.git on a
	// git server.
	libCommit := testenv.Submodule(t, lib, "deps/inner", "../"+filepath.Base(inner), innerCommit)
	testenv.Commit(t, lib, map[string]string{"lib.txt": "lib v2"}) // the gitlink pins v1
	repo, _ := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\nCOPY . /\n"})
	commit := testenv.Submodule(t, repo, "app/vendor/lib", "../"+filepath.Base(lib), libCommit)

	s := &Sources{Dir: t.TempDir()}
	var lines []string
	w := &BuildWorker{Sources: s, Builder: builderFunc(func(_ context.Context, req BuildRequest) (Result, error) {
		if got := readFile(t, filepath.Join(req.ContextDir, "vendor", "lib", "lib.txt")); got != "lib v1" {
			t.Errorf("vendor/lib/lib.txt = %q, want the pinned commit's", got)
		}
		if got := readFile(t, filepath.Join(req.ContextDir, "vendor", "lib", "deps", "inner", "inner.txt")); got != "inner" {
			t.Errorf("the nested submodule's file = %q", got)
		}
		return Result{Digest: "sha256:" + strings.Repeat("d", 64)}, nil
	})}
	ask := mesh.Ask{Module: "app", Image: "reg.example/app", Source: mesh.Source{Repo: repo, Commit: commit, Path: "app"}}
	if _, err := w.Work(ctx, ask, func(l string) { lines = append(lines, l) }); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"source: submodule vendor/lib: " + lib + " at " + short(libCommit),
		"source: submodule vendor/lib/deps/inner: " + inner + " at " + short(innerCommit),
		"source: 1 file in the build context is a Git LFS pointer (vendor/lib/big.bin): the objects",
	}
	var said []string
	for _, l := range lines {
		if strings.Contains(l, "submodule") || strings.Contains(l, "Git LFS") {
			if strings.Contains(l, "Git LFS") {
				l = l[:min(len(l), len(want[2]))]
			}
			said = append(said, l)
		}
	}
	if strings.Join(said, "\n") != strings.Join(want, "\n") {
		t.Errorf("the build log on submodules:\n%s\nwant\n%s", strings.Join(said, "\n"), strings.Join(want, "\n"))
	}

	for _, c := range []struct {
		name, url, commit, want string
	}{
		{"a commit its repository lacks", "../" + filepath.Base(lib), strings.Repeat("e", 40), "source: submodule vendor/other: commit " + strings.Repeat("e", 40) + " not found in " + lib},
		{"a repository that is not there", "../no-such-repository", libCommit, "source: submodule vendor/other: repository " + filepath.Join(filepath.Dir(lib), "no-such-repository") + " not found"},
		{"a url above the root", strings.Repeat("../", 40) + "x", libCommit, "climbs above"},
		{"a remote helper", "ext::sh -c touch% /tmp/pwned", libCommit, "a url through a remote helper is not fetched"},
	} {
		bad := testenv.Submodule(t, repo, "app/vendor/other", c.url, c.commit)
		_, err := s.Checkout(ctx, mesh.Source{Repo: repo, Commit: bad, Path: "app"})
		if !errors.Is(err, ErrSource) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a source error saying %q", c.name, err, c.want)
		}
		if _, err := os.Stat("/tmp/pwned"); err == nil {
			t.Fatal("the remote helper ran")
		}
	}
}

// A submodule's url that is a path on the building machine is fetched only
// for a repository fetched from the machine itself; a remote helper
// (transport::address) never.
func TestRefusedSubmoduleURLs(t *testing.T) {
	local := t.TempDir()
	c := &gitcache.Cache{Dir: t.TempDir(), InsteadOf: map[string]string{"https://mirror.example/": local + "/"}}
	for _, tc := range []struct {
		repo, url string
		refused   bool
	}{
		{"https://git.example/org/fleet.git", "https://git.example/org/lib.git", false},
		{"https://git.example/org/fleet.git", "git@git.example:org/lib.git", false},
		{"https://git.example/org/fleet.git", "/var/lib/meshbuild/agent/secrets", true},
		{"https://git.example/org/fleet.git", "file:///etc", true},
		{"https://git.example/org/fleet.git", "ext::sh -c id", true},
		{"https://git.example/org/fleet.git", "-uhelp", true},
		{local + "/fleet", local + "/lib", false},
		{"https://mirror.example/fleet", local + "/lib", false}, // fetched from this machine
	} {
		if got := refusedURL(c, tc.repo, tc.url); (got != "") != tc.refused {
			t.Errorf("refusedURL(%s, %s) = %q, want refused %v", tc.repo, tc.url, got, tc.refused)
		}
	}
}

// lfsPointer is a Git LFS pointer file as git stores it in place of the
// file it tracks.
const lfsPointer = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n"

// TestLFSPointersAreSaidInTheBuildLog: a file Git LFS tracks is stored
// in git as a pointer, and the checkout writes the pointer (as docker
// build of a git context does): the build's log names the pointers, the
// first five and how many, once a build; a file that only begins like one
// but is larger than any pointer, or a context without any, says nothing.
func TestLFSPointersAreSaidInTheBuildLog(t *testing.T) {
	ctx := context.Background()
	files := map[string]string{
		"app/Dockerfile":   "FROM scratch\nCOPY . /\n",
		"other/Dockerfile": "FROM scratch\n",
		"other/large.txt":  "version https://git-lfs.github.com/spec/v1\n" + strings.Repeat("x", 2000),
	}
	for i := range 7 {
		files[fmt.Sprintf("app/assets/%d.bin", i)] = lfsPointer
	}
	repo, commit := testenv.GitRepo(t, files)
	w := &BuildWorker{Sources: &Sources{Dir: t.TempDir()}, Builder: builderFunc(func(_ context.Context, req BuildRequest) (Result, error) {
		return Result{Digest: "sha256:" + strings.Repeat("d", 64)}, nil
	})}
	for _, c := range []struct{ path, want string }{
		{"app", "source: 7 files in the build context are Git LFS pointers (assets/0.bin, assets/1.bin, assets/2.bin, assets/3.bin, assets/4.bin and 2 more): the objects they name are not fetched"},
		{"other", ""},
		{"app", "source: 7 files in the build context are Git LFS pointers (assets/0.bin"}, // from the kept checkout
	} {
		var said []string
		ask := mesh.Ask{Module: c.path, Image: "reg.example/" + c.path, Source: mesh.Source{Repo: repo, Commit: commit, Path: c.path}}
		if _, err := w.Work(ctx, ask, func(l string) {
			if strings.Contains(l, "Git LFS") {
				said = append(said, l)
			}
		}); err != nil {
			t.Fatal(err)
		}
		if c.want == "" && len(said) != 0 || c.want != "" && (len(said) != 1 || !strings.HasPrefix(said[0], c.want)) {
			t.Errorf("%s's build log on LFS: %q, want %q", c.path, said, c.want)
		}
	}
}

// A relative submodule url of a repository this machine fetches from a
// local mirror (--git-instead-of), with no rewrite of its own, is fetched
// from the mirror's sibling: "../lib" of https://git.example/org/fleet.git,
// mirrored at <dir>/fleet, from <dir>/lib. One whose sibling is not there is
// fetched from the url as resolved (and fails here: the host is not).
func TestARelativeSubmoduleOfAMirroredRepositoryIsTheMirrorsSibling(t *testing.T) {
	ctx := context.Background()
	lib, libCommit := testenv.GitRepo(t, map[string]string{"lib.txt": "lib"})
	mirror, _ := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\n"})
	commit := testenv.Submodule(t, mirror, "app/vendor/lib", "../"+filepath.Base(lib), libCommit)
	const remote = "https://git.example/org/fleet.git"
	s := &Sources{Dir: t.TempDir(), InsteadOf: map[string]string{remote: mirror}}
	dir, err := s.Checkout(ctx, mesh.Source{Repo: remote, Commit: commit, Path: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(dir, "vendor", "lib", "lib.txt")); got != "lib" {
		t.Errorf("vendor/lib/lib.txt = %q", got)
	}
	if subs := s.Submodules(dir); len(subs) != 1 || subs[0].URL != lib {
		t.Errorf("submodules %+v, want vendor/lib from %s", subs, lib)
	}
	s.Release(dir)

	gone := testenv.Submodule(t, mirror, "app/vendor/gone", "../no-such-sibling", libCommit)
	_, err = s.Checkout(ctx, mesh.Source{Repo: remote, Commit: gone, Path: "app"})
	if err == nil || !strings.Contains(err.Error(), "submodule vendor/gone") || !strings.Contains(err.Error(), "https://git.example/org/no-such-sibling") {
		t.Errorf("a sibling that is not there: %v, want the resolved url's failure", err)
	}
}
