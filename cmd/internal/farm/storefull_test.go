package farm

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// A farm whose state directory's disk filled up: NATS's file store could
// not write, and from then every stream that met the error refused its
// writes, even once the disk had room (nats-server keeps a store's write
// error) — by hand, no claim was renewed and no push planned until builds
// up was started again. Now the farm says so on the operator's terminal
// (its log is on the same disk), starts NATS again once there is room, and
// the machines' claims are renewed again.
func TestAFarmWhoseStoreFilledUpRunsAgainOnceThereIsRoom(t *testing.T) {
	testenv.RequireBuildkit(t)
	// Room for what the catalogue's streams and buckets reserve (the
	// server's store may take three quarters of the free disk), and more.
	state := testenv.Tmpfs(t, "1200m")
	catalogue, _ := testenv.SmallFleet(t, "base")
	var out testenv.Buffer
	f, err := Up(context.Background(), UpOptions{
		Catalogue: catalogue, StateDir: state, ListenNATS: "127.0.0.1:0", ListenRegistry: testenv.FreePorts(t, 1), Agents: 1,
		BuildkitdBin: testenv.BuildkitdBin(t), Log: testenv.Log(t, "farm"), Out: &out,
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	defer f.Stop()
	machine := f.Machines()[0]

	fill := filepath.Join(state, "fill")
	fillUp(t, fill)
	// The agent renews its seat's claim every third of its lease: a write
	// the store cannot make.
	testenv.WaitFor(t, time.Minute, "the farm saying NATS could not write its store", func() bool {
		return strings.Contains(out.String(), "NATS could not write its store in ")
	})
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the farm saying NATS runs again", func() bool {
		return strings.Contains(out.String(), "NATS is running again on ")
	})
	again := time.Now()

	nc, _, err := daemon.Connect(f.NATSURL(), f.OperatorCreds(), mesh.OperatorPrincipal, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Written since: the machine's claim of its build seat, renewed.
	testenv.WaitFor(t, 45*time.Second, machine+"'s build seat claim renewed after NATS ran again", func() bool {
		r, err := deploy.Call(context.Background(), nc, mesh.SeatsTool, deploy.Request{})
		if err != nil {
			return false
		}
		for _, s := range r.Seats {
			for _, c := range s.Claims {
				if s.Seat == mesh.BuildSeat && c.Node == machine && c.Renewed.After(again) {
					return true
				}
			}
		}
		return false
	})
}

// fillUp writes path until its file system is full.
func fillUp(t *testing.T, path string) {
	t.Helper()
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = io.Copy(w, io.LimitReader(zeros{}, 1<<40))
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling %s: %v, want no space left", path, err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
