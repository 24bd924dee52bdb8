package agent

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/docker/go-units"
	"golang.org/x/sys/unix"

	"github.com/meshbuild/meshbuild/internal/diskfree"
	"github.com/meshbuild/meshbuild/internal/gitcache"
)

// # This machine's own disk
//
// A machine whose workspace (Sources.Dir: its clones and checkouts) is
// full, out of quota or read-only cannot fetch or write a build's source,
// whatever the ask: that is the machine's trouble, never the source's. By
// hand, a machine whose workspace filled up said of every ask it took "not
// found in this machine's mirror" (git's fetch failed, and the commit was
// then not there), and a repository fetched from a local path would have
// been failed for good as "not a git repository". So a failure whose cause
// is the machine's own resources is infrastructure and says that cause
// (localFailure), and the machine's probe (BuildWorker.Probe) finds a
// workspace with less than Sources.MinFree free: the machine turns sick,
// takes no ask until space is freed, and says why.

// DefaultMinFree is the free space a build machine's workspace needs
// before it takes an ask (build-agent --min-free): below it, the machine
// is sick. A fetch and a checkout of a small repository fit well within
// it; a machine that builds a large one sets more.
const DefaultMinFree = 64 << 20

// localErrnos are the errors of this machine's own resources: its disk full
// or out of quota, read-only, out of memory or of file descriptors.
var localErrnos = []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE}

// localWords are how git, which reports those errors in its own words on
// its standard error, says them (strerror's text).
var localWords = []string{"no space left on device", "disk quota exceeded", "read-only file system", "cannot allocate memory", "out of memory", "too many open files"}

// localFailure reports whether err was caused by this machine's own
// resources, and says how in one line (the line of git's output that says
// it, or the error's).
func localFailure(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	var ge *gitcache.Error
	if errors.As(err, &ge) {
		for _, line := range strings.Split(ge.Stderr, "\n") {
			if l := strings.ToLower(line); containsAny(l, localWords) {
				return strings.TrimSpace(line), true
			}
		}
	}
	for _, e := range localErrnos {
		if errors.Is(err, e) {
			return lastLine(err.Error()), true
		}
	}
	if s := strings.ToLower(err.Error()); containsAny(s, localWords) {
		return lastLine(err.Error()), true
	}
	return "", false
}

func containsAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// localError is the ErrInfra of a failure of this machine's own resources
// while it prepared repo's source in its workspace.
func (s *Sources) localError(repo, why string, err error) error {
	return classified(ErrInfra, fmt.Sprintf("this machine's workspace %s cannot take the source of %s: %s", s.Dir, repo, why), err)
}

// Probe reports whether this machine's workspace can take a build's
// source: its directory can be made, is writable, and its file system has
// MinFree free for this process's user (none when MinFree is 0).
func (s *Sources) Probe() error {
	if s == nil || s.Dir == "" {
		return nil
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fmt.Errorf("workspace %s: %w", s.Dir, err)
	}
	if err := unix.Access(s.Dir, unix.W_OK); err != nil {
		return fmt.Errorf("workspace %s is not writable: %w", s.Dir, err)
	}
	if s.MinFree <= 0 {
		return nil
	}
	free, err := diskfree.Free(s.Dir)
	if err != nil {
		return fmt.Errorf("workspace %s: %w", s.Dir, err)
	}
	if free < s.MinFree {
		return fmt.Errorf("workspace %s has %s free, less than the %s a build needs (--min-free): free some space there",
			s.Dir, units.BytesSize(float64(free)), units.BytesSize(float64(s.MinFree)))
	}
	return nil
}
