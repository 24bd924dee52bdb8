package buildkitd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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
	} {
		if !strings.Contains(got, want) {
			t.Errorf("config lacks %q:\n%s", want, got)
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
	if os.Getenv("MESHBUILD_BUILDKIT") != "1" {
		t.Skip("needs buildkitd: set MESHBUILD_BUILDKIT=1 (make test does)")
	}
	wd, _ := os.Getwd()
	bin := filepath.Join(wd, "..", "..", "bin", "buildkitd")
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
	c, err := client.New(ctx, b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ws, err := c.ListWorkers(ctx)
	if err != nil || len(ws) == 0 {
		t.Fatalf("ListWorkers = %v, %v", ws, err)
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
