// Package registrytest starts the embedded registry for a test. It is for
// tests only.
package registrytest

import (
	"context"
	"testing"

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
