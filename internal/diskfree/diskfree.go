// Package diskfree says how much room a directory's file system has left:
// what a build machine's probe (its workspace) and builds up (its NATS
// store, after a write it could not make) both ask.
package diskfree

import "golang.org/x/sys/unix"

// Free is the space left on dir's file system for this process's user
// (statfs's available blocks: the root's reserve not counted), in bytes.
func Free(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
