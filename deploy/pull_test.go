package deploy_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// layerTar is a tarball of one file.
func layerTar(t *testing.T, file, content string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: file, Mode: 0o644, Size: int64(len(content))}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(content)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func push(t *testing.T, ref string, img v1.Image) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return r.Context().String() + "@" + d.String()
}

// A node pulls an image whatever its layers' compression — gzip, zstd, or
// none, as runtimes run them all — and verifies every layer against the
// diff id its config lists: an image whose config names content its
// layers do not hold is refused.
func TestPullVerifiesLayersOfEveryCompression(t *testing.T) {
	host := registrytest.Registry(t)
	ctx := context.Background()
	opener := func(b []byte) tarball.Opener {
		return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	gz, err := tarball.LayerFromOpener(opener(layerTar(t, "a", "gzip layer")), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	zs, err := tarball.LayerFromOpener(opener(layerTar(t, "b", "zstd layer")), tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	raw := static.NewLayer(layerTar(t, "c", "uncompressed layer"), types.OCIUncompressedLayer)
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), gz, zs, raw)
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	good := push(t, host+"/mixed", img)
	if err := deploy.Pull(ctx, filepath.Join(t.TempDir(), "layout"), good, registry.NewClient()); err != nil {
		t.Fatalf("pulling an image of gzip, zstd and uncompressed layers: %v", err)
	}

	// The same layers, the config's diff id of the zstd layer another
	// layer's: every blob matches its digest, the content does not.
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[1] = cf.RootFS.DiffIDs[0]
	liar, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	bad := push(t, host+"/liar", liar)
	err = deploy.Pull(ctx, filepath.Join(t.TempDir(), "layout"), bad, registry.NewClient())
	if !errors.Is(err, deploy.ErrVerify) || !strings.Contains(err.Error(), "diff id") {
		t.Fatalf("pulling an image whose config lies about a layer: %v, want %v naming the diff id", err, deploy.ErrVerify)
	}
}
