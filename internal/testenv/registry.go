package testenv

import (
	"context"
	"testing"

	"github.com/meshbuild/meshbuild/internal/demo/busybox"
	"github.com/meshbuild/meshbuild/registry"
)

// Registry starts the embedded registry on a free loopback port, its
// content in a temp dir, and returns its host:port. It stops in cleanup.
func Registry(t testing.TB) string {
	t.Helper()
	s, err := registry.Serve(context.Background(), "127.0.0.1:0", t.TempDir())
	if err != nil {
		t.Fatalf("registry: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s.Addr()
}

// Busybox pushes the busybox base image to host/busybox (tagged latest) and
// returns its pinned reference, host/busybox@sha256:….
func Busybox(t testing.TB, host string) string {
	t.Helper()
	d, err := busybox.Push(context.Background(), host, "busybox")
	if err != nil {
		t.Fatalf("busybox: %v", err)
	}
	return host + "/busybox@" + d
}
