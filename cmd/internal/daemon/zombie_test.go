package daemon

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// A process killed with -9 and not yet reaped (a zombie until its parent
// or init waits for it; seen by hand for more than a second after kill -9
// of a build-agent, whose restart was then refused naming the dead pid)
// runs no more: its claim is the restarted holder's to take. A live one
// still runs.
func TestAKilledProcessNotYetReapedIsNotRunning(t *testing.T) {
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = live.Process.Kill(); _ = live.Wait() })
	if !running(live.Process.Pid) {
		t.Fatalf("pid %d runs: running says not", live.Process.Pid)
	}
	killed := exec.Command("sleep", "60")
	if err := killed.Start(); err != nil {
		t.Fatal(err)
	}
	pid := killed.Process.Pid
	// Not waited for until the end: a zombie meanwhile.
	t.Cleanup(func() { _ = killed.Wait() })
	if err := killed.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the killed process to end (a zombie)", func() bool {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return err == nil && len(data) > 0 && !running(pid)
	})
	host, _ := os.Hostname()
	holder := "build-agent on " + host + " pid "
	if why, stale := ownStale(claim.Record{Holder: holder + strconv.Itoa(pid)}, holder+strconv.Itoa(os.Getpid()), nil); !stale {
		t.Errorf("the claim of zombie pid %d is not taken as left behind", pid)
	} else if why == "" {
		t.Error("no reason given")
	}
	if _, stale := ownStale(claim.Record{Holder: holder + strconv.Itoa(live.Process.Pid)}, holder+strconv.Itoa(os.Getpid()), nil); stale {
		t.Error("the claim of a live process is taken as left behind")
	}
}
