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
// digest is the declared one and every blob matches its digest.
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
		if err := validate.Index(back); err != nil {
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
	if err := validate.Image(back); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrVerify, ref, err)
	}
	return checkDigest(back.Digest, want, ref)
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
