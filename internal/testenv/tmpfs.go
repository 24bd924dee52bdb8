package testenv

import (
	"os"
	"syscall"
	"testing"
)

// Tmpfs mounts a tmpfs of size ("256k", "1200m") on a new directory and
// returns it, unmounted in cleanup: a file system that fills up for real.
// It needs root, as `make test` runs; otherwise the test is skipped.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}
