package diskfree

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshbuild/meshbuild/internal/testenv"
)

// Free follows what is written on a real file system (a tmpfs of 1 MiB,
// mounted as root) and names a directory that is not there as an error.
func TestFreeFollowsWhatIsWritten(t *testing.T) {
	dir := testenv.Tmpfs(t, "1m")
	before, err := Free(dir)
	if err != nil || before != 1<<20 {
		t.Fatalf("Free of an empty 1 MiB tmpfs = %d, %v", before, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, 512<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if after, err := Free(dir); err != nil || after != before-512<<10 {
		t.Errorf("Free after writing 512 KiB = %d, %v; want %d", after, err, before-512<<10)
	}
	if _, err := Free(filepath.Join(dir, "nope")); err == nil {
		t.Error("Free of a directory that is not there: no error")
	}
}
