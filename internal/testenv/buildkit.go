package testenv

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshbuild/meshbuild/internal/buildkitd"
)

// RequireBuildkit skips t unless MESHBUILD_BUILDKIT=1.
func RequireBuildkit(t testing.TB) {
	t.Helper()
	if os.Getenv(BuildkitEnv) != "1" {
		t.Skipf("needs buildkitd: set %s=1 (make test does)", BuildkitEnv)
	}
}

// Buildkitd starts bin/buildkitd, trusting registryHosts over plain HTTP,
// and returns its address for client.New. It skips t unless
// MESHBUILD_BUILDKIT=1, and fails it if the daemon will not start. The
// daemon is stopped in cleanup.
func Buildkitd(t testing.TB, registryHosts ...string) string {
	t.Helper()
	return BuildkitdWith(t, buildkitd.Options{RegistryHosts: registryHosts})
}

// BuildkitdWith is Buildkitd with options (MaxParallelism, Snapshotter).
// Bin, Root and Stderr default to bin/buildkitd, a temp dir and the test's
// record of the daemon's log.
func BuildkitdWith(t testing.TB, o buildkitd.Options) string {
	t.Helper()
	return StartBuildkitd(t, o).Addr()
}

// StartBuildkitd is BuildkitdWith returning the daemon itself, for a test
// that stops it early. It is stopped in cleanup too.
func StartBuildkitd(t testing.TB, o buildkitd.Options) *buildkitd.Buildkitd {
	t.Helper()
	RequireBuildkit(t)
	if o.Bin == "" {
		root, err := RepoRoot()
		if err != nil {
			t.Fatalf("buildkitd: %v", err)
		}
		o.Bin = filepath.Join(root, "bin", "buildkitd")
	}
	if o.Root == "" {
		o.Root = t.TempDir()
	}
	b, err := buildkitd.Start(context.Background(), o)
	if err != nil {
		t.Fatalf("buildkitd: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Logf("buildkitd: %v", err)
		}
		if t.Failed() {
			t.Logf("buildkitd log (tail):\n%s", b.Log())
		}
	})
	return b
}
