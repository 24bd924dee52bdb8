package registry

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

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BusyboxPath is where Debian's busybox-static puts its binary.
const BusyboxPath = "/bin/busybox"

// BusyboxApplets are the commands the busybox base image links to
// /bin/busybox.
var BusyboxApplets = []string{
	"sh", "echo", "cat", "ls", "sleep", "mkdir", "touch", "wc",
	"rm", "cp", "mv", "env", "true", "false", "test", "grep", "head", "tail", "printf",
}

// layerTime is the modification time of every file in the busybox layer, so
// that the same binary always gives the same digest.
var layerTime = time.Unix(0, 0).UTC()

// Busybox returns the busybox base image: one layer holding the static
// busybox of the build machine at /bin/busybox, symlinks to it for
// BusyboxApplets, an empty /tmp, and PATH=/bin. It is built from scratch
// (no registry needed), deterministically: the same binary always gives the
// same digest.
func Busybox() (v1.Image, error) {
	bin, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return nil, fmt.Errorf("reading busybox: %w (apt-get install -y busybox-static)", err)
	}
	if err := checkStatic(bin); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdrs := []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777},
		{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin))},
	}
	for _, a := range BusyboxApplets {
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
		return fmt.Errorf("%s is not an ELF binary: %w", BusyboxPath, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New(BusyboxPath + " is dynamically linked; apt-get install -y busybox-static")
		}
	}
	return nil
}

// PushBusybox pushes the [Busybox] base image to registryHost/repo, tagged
// latest, through a [Client] made of opts, and returns its manifest digest.
func PushBusybox(ctx context.Context, registryHost, repo string, opts ...ClientOption) (string, error) {
	img, err := Busybox()
	if err != nil {
		return "", err
	}
	c := NewClient(opts...)
	ref, err := c.parse(registryHost + "/" + repo + ":latest")
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, c.remote(ctx)...); err != nil {
		return "", fmt.Errorf("pushing %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("busybox digest: %w", err)
	}
	return d.String(), nil
}
