package registry_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/meshbuild/meshbuild/internal/busybox"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/registry"
)

// client is the default registry client: loopback registries over plain
// HTTP, credentials from the docker config.
var client = registry.NewClient()

func newRegistry(t *testing.T) (host, dir string) {
	t.Helper()
	dir = t.TempDir()
	s := httptest.NewServer(registry.New(dir))
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://"), dir
}

func TestPushBusyboxResolve(t *testing.T) {
	ctx := context.Background()
	host, dir := newRegistry(t)

	dgst, err := busybox.Push(ctx, host, "busybox")
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{host + "/busybox:latest", host + "/busybox", host + "/busybox@" + dgst} {
		got, err := client.Resolve(ctx, ref)
		if err != nil {
			t.Fatalf("Resolve(%s): %v", ref, err)
		}
		if got != dgst {
			t.Errorf("Resolve(%s) = %s, want %s", ref, got, dgst)
		}
	}

	// The blobs are on disk, one file per digest, in distribution's layout.
	bref, err := name.ParseReference(host + "/busybox@" + dgst)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(bref)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("busybox has %d layers, want 1", len(layers))
	}
	ld, _ := layers[0].Digest()
	cd, _ := img.ConfigName()
	for _, h := range []string{ld.Hex, cd.Hex} {
		if _, err := os.Stat(filepath.Join(dir, "docker/registry/v2/blobs/sha256", h[:2], h, "data")); err != nil {
			t.Errorf("blob not on disk: %v", err)
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || len(cfg.Config.Env) != 1 || cfg.Config.Env[0] != "PATH=/bin" {
		t.Errorf("config: os %q env %q", cfg.OS, cfg.Config.Env)
	}

	size, err := client.Size(ctx, host+"/busybox@"+dgst)
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := layers[0].Size()
	if size <= ls {
		t.Errorf("Size = %d, want more than the layer's %d", size, ls)
	}
}

func TestResolveErrors(t *testing.T) {
	ctx := context.Background()
	host, _ := newRegistry(t)

	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
	}))
	t.Cleanup(failing.Close)

	for _, tc := range []struct {
		name                string
		ref                 string
		infra, rejected, nf bool
	}{
		{"unknown repository", host + "/nothing:latest", false, true, true},
		{"unknown digest", host + "/nothing@sha256:" + strings.Repeat("a", 64), false, true, true},
		{"connection refused", testenv.ClosedAddr(t) + "/x:latest", true, false, false},
		{"5xx", strings.TrimPrefix(failing.URL, "http://") + "/x:latest", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.Resolve(ctx, tc.ref)
			if err == nil {
				t.Fatal("Resolve: no error")
			}
			if got := registry.IsInfra(err); got != tc.infra {
				t.Errorf("IsInfra(%v) = %v, want %v", err, got, tc.infra)
			}
			if got := registry.IsRejected(err); got != tc.rejected {
				t.Errorf("IsRejected(%v) = %v, want %v", err, got, tc.rejected)
			}
			if got := registry.IsNotFound(err); got != tc.nf {
				t.Errorf("IsNotFound(%v) = %v, want %v", err, got, tc.nf)
			}
		})
	}
	if _, err := client.Resolve(ctx, "Not A Reference"); err == nil || registry.IsInfra(err) {
		t.Errorf("Resolve of a malformed reference: %v", err)
	}
}

func TestPing(t *testing.T) {
	ctx := context.Background()
	host, _ := newRegistry(t)
	if err := client.Ping(ctx, host); err != nil {
		t.Errorf("Ping(live): %v", err)
	}
	if err := client.Ping(ctx, testenv.ClosedAddr(t)); !registry.IsInfra(err) {
		t.Errorf("Ping(closed) = %v, want an infra error", err)
	}
}

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := filepath.Join(t.TempDir(), "blobs")
	s, err := registry.Serve(ctx, "127.0.0.1:0", dir)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(s.Addr() + "/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	got, err := client.Resolve(ctx, ref.String())
	if err != nil || got != want.String() {
		t.Fatalf("Resolve = %s, %v; want %s", got, err, want)
	}

	// Cancelling ctx stops the server: the next call cannot connect.
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = client.Resolve(context.Background(), ref.String())
		if registry.IsInfra(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after cancel, Resolve = %v, want an infra error", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
