package buildkitd

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/buildkit/client"
)

func TestOptionsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"no bin", Options{Root: "/tmp/x"}},
		{"no root", Options{Bin: "/bin/true"}},
		{"negative parallelism", Options{Bin: "/bin/true", Root: "/tmp/x", MaxParallelism: -1}},
		{"long socket", Options{Bin: "/bin/true", Root: "/tmp/x", Socket: "/tmp/" + strings.Repeat("s", 120)}},
		{"bad host", Options{Bin: "/bin/true", Root: "/tmp/x", RegistryHosts: []string{`a"b`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Start(context.Background(), tc.o); !errors.Is(err, ErrOptions) {
				t.Errorf("Start = %v, want ErrOptions", err)
			}
		})
	}
}

func TestMissingBinary(t *testing.T) {
	_, err := Start(context.Background(), Options{Bin: filepath.Join(t.TempDir(), "buildkitd"), Root: t.TempDir()})
	if !errors.Is(err, ErrNoBinary) {
		t.Fatalf("Start = %v, want ErrNoBinary", err)
	}
	if !strings.Contains(err.Error(), "scripts/install-deps.sh") {
		t.Errorf("error %q does not say how to get the binary", err)
	}
}

func TestMissingRunc(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Start(context.Background(), Options{Bin: "/bin/sh", Root: t.TempDir()})
	if !errors.Is(err, ErrNoRunc) || !strings.Contains(err.Error(), "apt-get install -y runc") {
		t.Fatalf("Start = %v, want ErrNoRunc naming apt-get", err)
	}
}

func TestConfig(t *testing.T) {
	o := Options{Root: "/var/lib/bk", Snapshotter: "overlayfs", MaxParallelism: 3, RegistryHosts: []string{"127.0.0.1:5000", "reg:80"}}
	got := config(o, "unix:///tmp/bk1/buildkitd.sock", "/tmp/bk1/otel-grpc.sock")
	for _, want := range []string{
		`root = "/var/lib/bk"`,
		`address = ["unix:///tmp/bk1/buildkitd.sock"]`,
		`socketPath = "/tmp/bk1/otel-grpc.sock"`,
		`snapshotter = "overlayfs"`,
		`max-parallelism = 3`,
		"[registry.\"127.0.0.1:5000\"]\n  http = true",
		"[registry.\"reg:80\"]\n  http = true",
		"[worker.containerd]\n  enabled = false",
		"gc = false",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("config lacks %q:\n%s", want, got)
		}
	}
	o.GC = true
	if got := config(o, "unix:///tmp/bk1/buildkitd.sock", ""); !strings.Contains(got, "gc = true") || strings.Contains(got, "socketPath") {
		t.Errorf("config with GC:\n%s", got)
	}
}

// A daemon started with GC collects its cache by BuildKit's default
// policies, as its worker says; one without has none (the cache of a test
// or a benchmark stays).
func TestGCIsOnWhereAsked(t *testing.T) {
	bin := daemonBin(t)
	for _, gc := range []bool{true, false} {
		b, err := Start(context.Background(), Options{Bin: bin, Root: t.TempDir(), GC: gc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Stop() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := client.New(ctx, b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		ws, err := c.ListWorkers(ctx)
		c.Close()
		cancel()
		if err != nil || len(ws) == 0 {
			t.Fatalf("workers: %v, %v", ws, err)
		}
		if got := len(ws[0].GCPolicy) > 0; got != gc {
			t.Errorf("GC %v: the worker's GC policies %+v", gc, ws[0].GCPolicy)
		}
	}
}

// A binary that exits at once is reported with its output, quickly; with
// the default snapshotter, native is tried after overlayfs.
func TestDaemonExits(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "buildkitd")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho \"no worker for $2\" >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := Start(context.Background(), Options{Bin: bin, Root: t.TempDir()})
	if !errors.Is(err, errExited) || !strings.Contains(err.Error(), "no worker for") {
		t.Fatalf("Start = %v, want the daemon's output", err)
	}
	if !strings.Contains(err.Error(), "with overlayfs") {
		t.Errorf("Start = %v, want the overlayfs attempt mentioned", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %s", d)
	}
}

func TestStartStop(t *testing.T) {
	bin := daemonBin(t)
	var log strings.Builder
	b, err := Start(context.Background(), Options{Bin: bin, Root: t.TempDir(), MaxParallelism: 1, Stderr: &log})
	if err != nil {
		t.Fatal(err)
	}
	sock := strings.TrimPrefix(b.Addr(), "unix://")
	if len(sock) > maxSocketPath {
		t.Errorf("socket path %s too long", sock)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Ping(ctx, b.Addr()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := b.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	select {
	case <-b.Exited():
	default:
		t.Error("Stop returned before the daemon exited")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket %s left behind: %v", sock, err)
	}
	if err := b.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if !strings.Contains(log.String(), "running server on") {
		t.Errorf("daemon log not passed to Stderr:\n%s", log.String())
	}
}

// TestStopAfterTheDaemonDiedSignalsNoOtherGroup: once a daemon that died
// is reaped, its pid — its process group's id — is free, and the kernel may
// give it to the next process started on the machine (pids wrap at
// kernel.pid_max, 32768 here, within minutes of a test run). Here that is
// done on purpose, as CRIU does, through kernel.ns_last_pid: a `sleep`
// leading a group of its own is given the dead daemon's pid. Stop must not
// signal that group.
func TestStopAfterTheDaemonDiedSignalsNoOtherGroup(t *testing.T) {
	bin := daemonBin(t)
	b, err := Start(context.Background(), Options{Bin: bin, Root: t.TempDir(), MaxParallelism: 1})
	if err != nil {
		t.Fatal(err)
	}
	pid := b.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the killed daemon was not seen to exit in 30s")
	}
	// Other processes (and this one's threads) may take the pid first:
	// try again.
	var other *exec.Cmd
	for range 200 {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Fatalf("setting the next pid (make test runs as root): %v", err)
		}
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == pid {
			other = cmd
			break
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	if other == nil {
		t.Fatalf("no process could be started with the dead daemon's pid %d in 200 tries", pid)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = other.Wait(); close(exited) }()
	t.Cleanup(func() { _ = other.Process.Kill(); <-exited })

	if err := b.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	// A signal sent by Stop is pending when Stop returns; sleep dies of it
	// within milliseconds.
	select {
	case <-exited:
		t.Fatalf("the process given the dead daemon's pid %d, leading its own group, ended when Stop ran: %v", pid, waitErr)
	case <-time.After(time.Second):
	}
}

// A daemon killed is started Again at its address, with its state: a
// client that knew the first finds the second; Again refuses a daemon
// still running; the last Stop removes the socket's directory Start made.
func TestAgainListensWhereTheKilledDaemonDid(t *testing.T) {
	bin := daemonBin(t)
	root := t.TempDir()
	b, err := Start(context.Background(), Options{Bin: bin, Root: root, MaxParallelism: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := b.Again(ctx); err == nil {
		t.Fatal("Again of a daemon still running: no error")
	}
	if b.ExitErr() != nil {
		t.Errorf("ExitErr of a running daemon = %v", b.ExitErr())
	}
	if err := syscall.Kill(b.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the killed daemon was not seen to exit in 30s")
	}
	if err := b.ExitErr(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("ExitErr = %v, want signal: killed", err)
	}
	if Ping(ctx, b.Addr()) == nil {
		t.Fatal("a killed daemon answers")
	}
	next, err := b.Again(ctx)
	if err != nil {
		t.Fatalf("Again: %v", err)
	}
	if next.Addr() != b.Addr() {
		t.Errorf("Again listens at %s, the first at %s", next.Addr(), b.Addr())
	}
	if err := Ping(ctx, b.Addr()); err != nil {
		t.Fatalf("no answer at %s after Again: %v", b.Addr(), err)
	}
	if next.opts.Root != root || next.opts.Snapshotter != b.opts.Snapshotter {
		t.Errorf("Again's options %+v, want the first's %+v", next.opts, b.opts)
	}
	if err := next.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	dir := filepath.Dir(strings.TrimPrefix(b.Addr(), "unix://"))
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the socket's directory %s is left after the last Stop: %v", dir, err)
	}
}

// daemonBin is the repository's bin/buildkitd, for a test that starts a
// real daemon; it skips the test unless MESHBUILD_BUILDKIT=1.
func daemonBin(t *testing.T) string {
	t.Helper()
	if os.Getenv("MESHBUILD_BUILDKIT") != "1" {
		t.Skip("needs buildkitd: set MESHBUILD_BUILDKIT=1 (make test does)")
	}
	wd, _ := os.Getwd()
	return filepath.Join(wd, "..", "..", "bin", "buildkitd")
}
