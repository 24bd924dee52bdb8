package agent

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// A module whose manifest says build.compression: zstd is pushed with its
// own layers zstd-compressed (OCI media types), the base's layers as the
// base has them; the image is as reproducible as a gzip one (two daemons
// with nothing in common push the same digest), its cached rebuild is the
// same image, the gzip build of the same sources another one, and a node
// pulls and verifies it (deploy.Pull).
func TestBuildZstdCompressesTheImagesOwnLayers(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	base := testenv.Busybox(t, host)
	dir := buildContext(t, map[string]string{
		"Dockerfile": "FROM runtime\nCOPY app.txt /srv/app.txt\nRUN seq 1 20000 > /srv/numbers\n",
		"app.txt":    "app\n",
	})
	req := func(compression, cache string) BuildRequest {
		return BuildRequest{ContextDir: dir, Ask: mesh.Ask{
			Image: host + "/zapp", Cache: cache, Key: "key-" + compression,
			Source: mesh.Source{Compression: compression},
			Bases:  []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}},
		}}
	}
	daemonA := newBuildKit(t, testenv.Buildkitd(t, host))
	first, err := daemonA.Build(ctx, req(mesh.CompressionZstd, host+"/cache:zapp"))
	if err != nil {
		t.Fatal(err)
	}
	img := remoteImage(t, first.Ref)
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	baseLayers, err := remoteImage(t, base).Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want %s (zstd layers need OCI media types)", m.MediaType, types.OCIManifestSchema1)
	}
	if n := len(baseLayers.Layers); len(m.Layers) != n+2 {
		t.Fatalf("%d layers, want the base's %d and 2 of its own", len(m.Layers), n)
	}
	for i, l := range m.Layers {
		switch {
		case i < len(baseLayers.Layers):
			if l.Digest != baseLayers.Layers[i].Digest {
				t.Errorf("layer %d, the base's, is %s: want the base's %s as it is", i, l.Digest, baseLayers.Layers[i].Digest)
			}
		case l.MediaType != types.OCILayerZStd:
			t.Errorf("layer %d, the module's own, is %s: want %s", i, l.MediaType, types.OCILayerZStd)
		}
	}

	// Another daemon, nothing in common but the sources and the base:
	// the same digest (every layer's file times rewritten to the epoch,
	// zstd as deterministic as gzip).
	other, err := newBuildKit(t, testenv.Buildkitd(t, host)).Build(ctx, req(mesh.CompressionZstd, ""))
	if err != nil {
		t.Fatal(err)
	}
	if other.Digest != first.Digest {
		t.Errorf("another daemon pushed %s, the first %s: a zstd image is not reproducible", other.Digest, first.Digest)
	}
	again, err := daemonA.Build(ctx, req(mesh.CompressionZstd, host+"/cache:zapp"))
	if err != nil {
		t.Fatal(err)
	}
	if again.CacheHits == 0 || again.Digest != first.Digest {
		t.Errorf("cached rebuild: %d cache hits, digest %s, want every step cached and %s", again.CacheHits, again.Digest, first.Digest)
	}
	gz, err := daemonA.Build(ctx, req("", ""))
	if err != nil {
		t.Fatal(err)
	}
	if gz.Digest == first.Digest {
		t.Errorf("the gzip build pushed the zstd build's digest %s", gz.Digest)
	}
	gm, err := remoteImage(t, gz.Ref).Manifest()
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range gm.Layers {
		if l.MediaType == types.OCILayerZStd {
			t.Errorf("the gzip build's layer %d is %s", i, l.MediaType)
		}
	}

	// A node pulls it by digest into its layout and verifies every blob,
	// the zstd layers uncompressed against their diff ids.
	if err := deploy.Pull(ctx, filepath.Join(t.TempDir(), "layout"), first.Ref, registry.NewClient()); err != nil {
		t.Fatalf("a node pulling the zstd image: %v", err)
	}
}

// A gzip export of a second or more is told in the build's log, with the
// manifest's field that makes it faster; a quick one, or a zstd one, is
// not.
func TestASlowGzipExportSaysWhatZstdSaves(t *testing.T) {
	spans := func(export time.Duration) Spans {
		var s Spans
		s.add(SpanSolve, export+time.Second)
		s.add(SpanExport, export)
		return s
	}
	if note := slowExportNote(spans(2400*time.Millisecond), ""); !strings.Contains(note, "2.4s") || !strings.Contains(note, "build.compression: zstd") {
		t.Errorf("a 2.4 s gzip export: note %q, want its time and build.compression: zstd", note)
	}
	if note := slowExportNote(spans(2400*time.Millisecond), mesh.CompressionGzip); note == "" {
		t.Error("a 2.4 s export, gzip spelt out: no note")
	}
	for _, c := range []struct {
		export      time.Duration
		compression string
	}{{300 * time.Millisecond, ""}, {2400 * time.Millisecond, mesh.CompressionZstd}} {
		if note := slowExportNote(spans(c.export), c.compression); note != "" {
			t.Errorf("export %s, compression %q: note %q, want none", c.export, c.compression, note)
		}
	}
}
