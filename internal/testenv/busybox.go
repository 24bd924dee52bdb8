package testenv

import (
	"context"
	"testing"

	"github.com/meshbuild/meshbuild/internal/busybox"
)

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
