package testenv

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/meshbuild/meshbuild/internal/natstest"
)

// ExampleFleet is examples/fleet in the repository.
func ExampleFleet(t testing.TB) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "examples", "fleet")
}

// SmallFleet copies part of the example fleet: the catalogue's manifests
// of the farm's own modules and of modules, and their sources.
func SmallFleet(t testing.TB, modules ...string) (catalogue, src string) {
	t.Helper()
	fleet := ExampleFleet(t)
	catalogue, src = t.TempDir(), t.TempDir()
	for _, m := range append([]string{"git", "build-agent", "build-controller"}, modules...) {
		data, err := os.ReadFile(filepath.Join(fleet, "catalogue", m+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(catalogue, m+".yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range modules {
		dir := m
		if strings.HasPrefix(m, "tool-") {
			dir = filepath.Join("tools", m)
		}
		if err := os.CopyFS(filepath.Join(src, dir), os.DirFS(filepath.Join(fleet, "src", dir))); err != nil {
			t.Fatal(err)
		}
	}
	return catalogue, src
}

// BuildkitdBin is the repository's bin/buildkitd (`make deps` builds it).
func BuildkitdBin(t testing.TB) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "bin", "buildkitd")
}

// FreePorts returns a loopback address whose port and the n-1 ports after
// it are free, outside the kernel's ephemeral range (natstest.FreePortRun:
// a port given up and taken again, as a restarted `builds up` does, is
// never some outgoing connection's source port meanwhile).
func FreePorts(t testing.TB, n int) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(natstest.FreePortRun(t, n))
}

// ClosedAddr returns a loopback address every dial to is refused for the
// test's life: a socket bound to it that never listens, closed at cleanup.
// No other process can take the port meanwhile, as one can a port FreeAddr
// gave up (a test's "unreachable" server once answered 404 in CI: another
// package's server had taken the port).
func ClosedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)
}

// FreeAddr reserves a loopback port and releases it: an address nothing
// listens on, for a server to take. For a dial that must be refused, use
// ClosedAddr.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// Scrape GETs url (a /metrics) and returns the body.
func Scrape(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Errorf("scraping %s: %v", url, err)
		return ""
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("scraping %s: %s, %v", url, resp.Status, err)
	}
	return string(body)
}

// GrepLines are the lines of s that contain substr.
func GrepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Buffer is a bytes.Buffer safe for the goroutines that write it (a farm's,
// a daemon's, exec's copying a child's output) and the test reading it.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
