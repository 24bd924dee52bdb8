package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// bigRepo is a repository whose commit does not fit in a few hundred KiB
// (a MiB of random bytes, which git cannot compress).
func bigRepo(t *testing.T) (repo, commit, tree string) {
	t.Helper()
	blob := make([]byte, 1<<20)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	repo, commit = testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM base\n", "app/blob": string(blob)})
	return repo, commit, gitTree(t, repo, commit, "app")
}

// A machine whose workspace is full cannot fetch any ask's source: that is
// the machine's trouble, retried elsewhere (ErrInfra), and the error says
// the cause — never the source's failure (by hand: "not found in this
// machine's mirror", and, from a repository fetched by its path, "not a
// git repository", failed for good).
func TestAFullWorkspaceIsTheMachinesTroubleNotTheSources(t *testing.T) {
	repo, commit, tree := bigRepo(t)
	for _, tc := range []struct {
		name string
		src  mesh.Source
		io   map[string]string
	}{
		{"the repository by its path", mesh.Source{Repo: repo, Commit: commit, Path: "app", Tree: tree}, nil},
		{"from this machine's mirror", mesh.Source{Repo: "https://git.example/fleet.git", Commit: commit, Path: "app", Tree: tree},
			map[string]string{"https://git.example/fleet.git": repo}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Sources{Dir: testenv.Tmpfs(t, "256k"), InsteadOf: tc.io}
			_, err := s.Checkout(context.Background(), tc.src)
			if !errors.Is(err, ErrInfra) || errors.Is(err, ErrSource) || Classify(err) != mesh.ReasonInfra {
				t.Fatalf("Checkout into a full workspace: %v, want ErrInfra", err)
			}
			msg := strings.ToLower(err.Error())
			if !strings.Contains(msg, "no space left on device") || !strings.Contains(msg, "workspace "+strings.ToLower(s.Dir)) || strings.Contains(msg, "not found") {
				t.Errorf("error %q does not say the workspace is full", err)
			}
		})
	}
	// Room made, the same ask checks out.
	s := &Sources{Dir: t.TempDir()}
	if _, err := s.Checkout(context.Background(), mesh.Source{Repo: repo, Commit: commit, Path: "app", Tree: tree}); err != nil {
		t.Fatal(err)
	}
}

// The machine's probe finds a workspace without MinFree free (or not
// writable): the machine turns sick and takes no ask until space is freed.
func TestAWorkspaceWithoutRoomMakesTheMachineSick(t *testing.T) {
	ctx := context.Background()
	dir := testenv.Tmpfs(t, "1m")
	w := &BuildWorker{Sources: &Sources{Dir: dir, MinFree: 512 << 10}}
	if err := w.Probe(ctx); err != nil {
		t.Fatalf("probe of an empty 1 MiB workspace needing 512 KiB: %v", err)
	}
	// Filled to under 512 KiB free.
	if err := os.WriteFile(filepath.Join(dir, "fill"), make([]byte, 700<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	err := w.Probe(ctx)
	if err == nil || !strings.Contains(err.Error(), "workspace "+dir+" has ") || !strings.Contains(err.Error(), "free, less than the 512KiB a build needs (--min-free)") {
		t.Fatalf("probe of a full workspace: %v", err)
	}
	// No check asked for: the machine builds (and a fetch says why it
	// cannot, above).
	w.Sources.MinFree = 0
	if err := w.Probe(ctx); err != nil {
		t.Errorf("probe with no MinFree: %v", err)
	}
	// Freed, it builds again.
	w.Sources.MinFree = 512 << 10
	if err := os.Remove(filepath.Join(dir, "fill")); err != nil {
		t.Fatal(err)
	}
	if err := w.Probe(ctx); err != nil {
		t.Errorf("probe once space is freed: %v", err)
	}
	// A workspace that cannot be written at all.
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatalf("remounting read-only: %v", err)
	}
	if err := w.Probe(ctx); err == nil || !strings.Contains(err.Error(), "not writable") {
		t.Errorf("probe of a read-only workspace: %v", err)
	}
}
