package deploy

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/meshbuild/meshbuild/registry"
)

// ErrVerify is wrapped when an image pulled into the layout does not match
// the digest it was declared with.
var ErrVerify = errors.New("image does not verify")

// Pull fetches an image (or image index) by digest into the OCI image
// layout at dir, then reads it back from the layout and verifies it: its
// digest is the declared one and every blob matches its digest, every
// layer's uncompressed content its diff id (verifyBlobs: a layer may be
// gzip, zstd or not compressed).
func Pull(ctx context.Context, dir, ref string, reg *registry.Client) error {
	d, err := name.NewDigest(ref)
	if err != nil {
		return fmt.Errorf("image %q: want REPOSITORY@sha256:…: %w", ref, err)
	}
	want, err := v1.NewHash(d.DigestStr())
	if err != nil {
		return fmt.Errorf("image %q: %w", ref, err)
	}
	desc, err := reg.Get(ctx, ref)
	if err != nil {
		return err
	}
	p, err := openLayout(dir)
	if err != nil {
		return err
	}
	annotate := layout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: ref})
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return fmt.Errorf("reading index %s: %w", ref, err)
		}
		if err := p.ReplaceIndex(idx, match.Digests(want), annotate); err != nil {
			return fmt.Errorf("writing %s into %s: %w", ref, dir, err)
		}
		got, err := p.ImageIndex()
		if err != nil {
			return err
		}
		back, err := got.ImageIndex(want)
		if err != nil {
			return fmt.Errorf("%w: %s is not in %s after writing: %v", ErrVerify, ref, dir, err)
		}
		if err := validate.Index(back, validate.Fast); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrVerify, ref, err)
		}
		if err := verifyIndexBlobs(back); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrVerify, ref, err)
		}
		return checkDigest(back.Digest, want, ref)
	}
	img, err := desc.Image()
	if err != nil {
		return fmt.Errorf("reading image %s: %w", ref, err)
	}
	if err := p.ReplaceImage(img, match.Digests(want), annotate); err != nil {
		return fmt.Errorf("writing %s into %s: %w", ref, dir, err)
	}
	back, err := p.Image(want)
	if err != nil {
		return fmt.Errorf("%w: %s is not in %s after writing: %v", ErrVerify, ref, dir, err)
	}
	if err := validate.Image(back, validate.Fast); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrVerify, ref, err)
	}
	if err := verifyBlobs(back); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrVerify, ref, err)
	}
	return checkDigest(back.Digest, want, ref)
}

// verifyBlobs reads every layer of img: its bytes must hash to its digest,
// and a layer's uncompressed content (go-containerregistry's Uncompressed,
// which tells gzip, zstd and none apart by their first bytes) to the diff
// id its config lists. validate.Image does the manifest and the config
// (validate.Fast), but reads every layer through gzip, refusing a zstd
// image or one of uncompressed layers that every runtime runs
// (google/go-containerregistry#1826). A blob of another kind than a layer
// (an attestation's statement) is checked by its digest only.
func verifyBlobs(img v1.Image) error {
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	if len(layers) != len(m.Layers) {
		return fmt.Errorf("%d layers read, the manifest lists %d", len(layers), len(m.Layers))
	}
	diffIDs := cf.RootFS.DiffIDs
	next := 0
	for i, l := range layers {
		desc := m.Layers[i]
		rc, err := l.Compressed()
		if err != nil {
			return fmt.Errorf("layer %d (%s): %w", i, desc.Digest, err)
		}
		got, n, err := v1.SHA256(rc)
		rc.Close()
		switch {
		case err != nil:
			return fmt.Errorf("layer %d (%s): %w", i, desc.Digest, err)
		case got != desc.Digest || n != desc.Size:
			return fmt.Errorf("layer %d: %d bytes of digest %s, the manifest says %d of %s", i, n, got, desc.Size, desc.Digest)
		}
		if !desc.MediaType.IsLayer() {
			continue
		}
		if next >= len(diffIDs) {
			return fmt.Errorf("layer %d (%s): the config lists %d diff ids", i, desc.Digest, len(diffIDs))
		}
		u, err := l.Uncompressed()
		if err != nil {
			return fmt.Errorf("layer %d (%s): %w", i, desc.Digest, err)
		}
		diffID, _, err := v1.SHA256(u)
		u.Close()
		switch {
		case err != nil:
			return fmt.Errorf("layer %d (%s, %s): uncompressing: %w", i, desc.Digest, desc.MediaType, err)
		case diffID != diffIDs[next]:
			return fmt.Errorf("layer %d (%s): uncompressed to %s, the config's diff id %d is %s", i, desc.Digest, diffID, next, diffIDs[next])
		}
		next++
	}
	if next != len(diffIDs) {
		return fmt.Errorf("the config lists %d diff ids for %d layers", len(diffIDs), next)
	}
	return nil
}

// verifyIndexBlobs is verifyBlobs of every image an index holds, nested
// indexes included.
func verifyIndexBlobs(idx v1.ImageIndex) error {
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, d := range m.Manifests {
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return err
			}
			if err := verifyIndexBlobs(child); err != nil {
				return fmt.Errorf("index %s: %w", d.Digest, err)
			}
		case d.MediaType.IsImage():
			img, err := idx.Image(d.Digest)
			if err != nil {
				return err
			}
			if err := verifyBlobs(img); err != nil {
				return fmt.Errorf("image %s: %w", d.Digest, err)
			}
		}
	}
	return nil
}

func checkDigest(digest func() (v1.Hash, error), want v1.Hash, ref string) error {
	got, err := digest()
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%w: %s has digest %s in the layout", ErrVerify, ref, got)
	}
	return nil
}

func openLayout(dir string) (layout.Path, error) {
	if p, err := layout.FromPath(dir); err == nil {
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", fmt.Errorf("creating the image layout %s: %w", dir, err)
	}
	return p, nil
}
