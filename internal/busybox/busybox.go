// Package busybox is the base image the demo and the tests build on: the
// build machine's static busybox (Debian's busybox-static) in one layer,
// made from scratch and deterministically, so that no registry outside the
// farm is needed. It is a fixture, not part of the registry's business.
package busybox

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Path is where Debian's busybox-static puts its binary.
const Path = "/bin/busybox"

// Applets are the commands the busybox base image links to
// /bin/busybox.
var Applets = []string{
	"sh", "echo", "cat", "ls", "sleep", "mkdir", "touch", "wc",
	"rm", "cp", "mv", "env", "true", "false", "test", "grep", "head", "tail", "printf",
}

// layerTime is the modification time of every file in the busybox layer, so
// that the same binary always gives the same digest.
var layerTime = time.Unix(0, 0).UTC()

// Static reads the build machine's busybox and refuses one that is
// dynamically linked: it would not run in an image that has no libc.
func Static() ([]byte, error) {
	bin, err := os.ReadFile(Path)
	if err != nil {
		return nil, fmt.Errorf("reading busybox: %w (apt-get install -y busybox-static)", err)
	}
	if err := checkStatic(bin); err != nil {
		return nil, err
	}
	return bin, nil
}

// Image returns the busybox base image: one layer holding the static
// busybox of the build machine at /bin/busybox, symlinks to it for
// Applets, an empty /tmp, and PATH=/bin. It is built from scratch
// (no registry needed), deterministically: the same binary always gives the
// same digest.
func Image() (v1.Image, error) {
	bin, err := Static()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdrs := []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777},
		{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin))},
	}
	for _, a := range Applets {
		hdrs = append(hdrs, &tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777})
	}
	for _, h := range hdrs {
		h.ModTime, h.Format = layerTime, tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing busybox layer: %w", err)
		}
		if h.Name == "bin/busybox" {
			if _, err := tw.Write(bin); err != nil {
				return nil, fmt.Errorf("writing busybox layer: %w", err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("writing busybox layer: %w", err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("busybox layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, fmt.Errorf("busybox image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("busybox image: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config.Env = []string{"PATH=/bin"}
	cfg.Config.Cmd = []string{"sh"}
	return mutate.ConfigFile(img, cfg)
}

// checkStatic refuses a dynamically linked busybox: it would not run in an
// image that has no libc.
func checkStatic(bin []byte) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("%s is not an ELF binary: %w", Path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New(Path + " is dynamically linked and would not run FROM scratch: apt-get install -y busybox-static")
		}
	}
	return nil
}

// Push pushes the [Image] to registryHost/repo, tagged latest, and returns
// its manifest digest. A loopback or private registryHost is spoken to over
// plain HTTP (go-containerregistry's rule).
func Push(ctx context.Context, registryHost, repo string) (string, error) {
	img, err := Image()
	if err != nil {
		return "", err
	}
	s := registryHost + "/" + repo + ":latest"
	ref, err := name.ParseReference(s)
	if err != nil {
		return "", fmt.Errorf("parsing reference %q: %w", s, err)
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("pushing %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("busybox digest: %w", err)
	}
	return d.String(), nil
}
