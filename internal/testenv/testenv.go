// Package testenv starts the real parts meshbuild's tests run against: a
// BuildKit daemon, a busybox base image in a registry, and git
// repositories. Each is stopped or removed in the test's cleanup. It sits
// below the core and imports none of its packages: the helpers that do
// stand beside the package they serve (mesh/meshtest: the test catalogues;
// registry/registrytest: the embedded registry; cascade/cascadetest: a
// controller, an agent, a plan store).
//
// Tests that need buildkitd run only when MESHBUILD_BUILDKIT=1 (make test
// sets it); without it they are skipped, saying so. With it, a daemon that
// will not start fails the test: it is never a skip.
package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// BuildkitEnv is the environment variable that turns on tests needing
// buildkitd.
const BuildkitEnv = "MESHBUILD_BUILDKIT"

var (
	rootOnce sync.Once
	root     string
	rootErr  error
)

// RepoRoot is the directory holding the module's go.mod, found by walking up
// from the working directory (a test's is its package directory).
func RepoRoot() (string, error) {
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			rootErr = err
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				root = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				rootErr = errors.New("no go.mod above the working directory")
				return
			}
			dir = parent
		}
	})
	return root, rootErr
}

// WaitFor polls cond every 20ms until it holds, failing the test after d
// with what it was waiting for.
func WaitFor(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
