package busybox_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/meshbuild/meshbuild/internal/busybox"
	"github.com/meshbuild/meshbuild/registry"
)

func TestImageDeterministic(t *testing.T) {
	a, err := busybox.Image()
	if err != nil {
		t.Fatal(err)
	}
	b, err := busybox.Image()
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("two builds of the busybox image differ: %s, %s", da, db)
	}
}

// Push stores the image under :latest in a real registry, by the digest
// it returns.
func TestPush(t *testing.T) {
	s := httptest.NewServer(registry.New(t.TempDir()))
	t.Cleanup(s.Close)
	host := strings.TrimPrefix(s.URL, "http://")
	ctx := context.Background()
	d, err := busybox.Push(ctx, host, "base")
	if err != nil {
		t.Fatal(err)
	}
	img, _ := busybox.Image()
	want, _ := img.Digest()
	if d != want.String() {
		t.Errorf("Push = %s, want the image's digest %s", d, want)
	}
	ref, err := name.ParseReference(host + "/base:latest")
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(ref, remote.WithContext(ctx))
	if err != nil || desc.Digest.String() != d {
		t.Errorf("HEAD base:latest = %v, %v; want %s", desc, err, d)
	}
}
