package agent

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sync/errgroup"

	"github.com/meshbuild/meshbuild/mesh"
)

// pushed is what a build pushed, as the registry holds it.
type pushed struct {
	// digest is the image manifest's: the image, not the index pushed
	// with attestations.
	digest string
	// size is the image's bytes in the registry: manifest, config, layers.
	size int64
	att  *mesh.Attestations
}

// verify reads back what buildkitd pushed as dgst to req.Image, in as few
// round trips as the answer needs: the manifest at dgst (which the
// registry must serve under that digest), then at once the image manifest
// (its size; the manifest itself when no index was pushed) and the
// attestation manifest (its statements); once both are read, the
// attestation manifest made a referrer of the image and then, for an
// index pushed by digest only, the tag moved to the index. The manifests already read are not fetched again to make
// the referrer and the tag. Its errors wrap ErrPush (the registry does not
// hold what was pushed) or ErrInfra.
func (b *BuildKit) verify(ctx context.Context, req BuildRequest, dgst string) (pushed, error) {
	ref := req.Image + "@" + dgst
	desc, err := b.opts.Registry.Get(ctx, ref)
	if err != nil {
		return pushed{}, registryError(ctx, "verifying "+ref, err)
	}
	if got := desc.Digest.String(); got != dgst {
		return pushed{}, classified(ErrPush, fmt.Sprintf("registry resolves %s to %s", ref, got), nil)
	}
	// With attestations BuildKit pushed an index: the image is the image
	// manifest in it, the rest is reported beside it.
	image, attDesc, isIndex, err := imageIn(desc, req.Platform)
	if err != nil {
		return pushed{}, classified(ErrPush, "reading "+ref+": "+err.Error(), err)
	}
	out := pushed{digest: image.Digest.String()}
	if !isIndex {
		size, err := imageSize(desc.Manifest, desc.Size)
		if err != nil {
			return pushed{}, classified(ErrPush, "reading "+ref+": "+err.Error(), err)
		}
		out.size = size
		return out, nil
	}
	return b.verifyIndex(ctx, req, desc, attDesc, out)
}

// verifyIndex reads, at once, the image manifest in the index desc (its
// size) and the attestation manifest attDesc (its statements), then makes
// the attestation manifest a referrer of the image and moves the tag to
// the index (see verify).
func (b *BuildKit) verifyIndex(ctx context.Context, req BuildRequest, desc *remote.Descriptor, attDesc *v1.Descriptor, out pushed) (pushed, error) {
	dgst := desc.Digest.String()
	ref := req.Image + "@" + dgst
	imageRef := req.Image + "@" + out.digest
	out.att = &mesh.Attestations{Index: dgst}
	g, gctx := errgroup.WithContext(ctx)
	imageRead := make(chan struct{})
	g.Go(func() error {
		var err error
		if out.size, err = b.sizeOf(ctx, gctx, imageRef); err != nil {
			return err
		}
		close(imageRead)
		return nil
	})
	// Once verified, where tools look for the attestations: the
	// attestation manifest among the image's referrers, then the tag on
	// the index (BuildKit's layout; the index was pushed by digest only).
	// One after the other: a registry without the referrers API (the tag
	// schema) was seen refusing the tag's index, "blob unknown", while the
	// referrers tag was being written beside it.
	g.Go(func() error {
		var adesc *remote.Descriptor
		if attDesc != nil {
			out.att.Manifest = attDesc.Digest.String()
			attRef := req.Image + "@" + out.att.Manifest
			var err error
			if adesc, err = b.opts.Registry.Get(gctx, attRef); err != nil {
				return registryError(ctx, "reading "+attRef, err)
			}
			out.att.Provenance, out.att.SBOM, err = statements(adesc.Manifest)
			if err != nil {
				return classified(ErrPush, "reading "+attRef+": "+err.Error(), err)
			}
		}
		select { // the referrer and the tag go on once the image is read too
		case <-imageRead:
		case <-gctx.Done():
			// The image's read failed (the group's error is its own) or
			// the build was cancelled.
			return context.Cause(gctx)
		}
		if attDesc != nil {
			attRef := req.Image + "@" + out.att.Manifest
			if err := b.opts.Registry.ReferFetched(gctx, attRef, adesc); err != nil {
				return registryError(ctx, "listing "+attRef+" among the referrers of "+out.digest, err)
			}
		}
		if req.Tag != "" {
			if err := b.opts.Registry.TagFetched(gctx, ref, desc, req.Tag); err != nil {
				return registryError(ctx, "tagging "+ref, err)
			}
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return pushed{}, err
	}
	return out, nil
}

// sizeOf is the bytes of the image imageRef (by digest) in the registry.
// An image verified before is the same bytes (a digest names its
// content): a rebuild whose image came out as it was (every step cached)
// does not read it again. The index just pushed that names it is read
// before, and the controller's fence resolves the image's digest in the
// registry before the built counts. Errors are classified against ctx,
// the build's (gctx is the verification's).
func (b *BuildKit) sizeOf(ctx, gctx context.Context, imageRef string) (int64, error) {
	if size, ok := b.sizes.get(imageRef); ok {
		return size, nil
	}
	m, err := b.opts.Registry.Get(gctx, imageRef)
	if err != nil {
		return 0, registryError(ctx, "reading "+imageRef, err)
	}
	size, err := imageSize(m.Manifest, m.Size)
	if err != nil {
		return 0, classified(ErrPush, "reading "+imageRef+": "+err.Error(), err)
	}
	b.sizes.put(imageRef, size)
	return size, nil
}

// imageSize is the bytes of the image whose manifest is raw (size bytes
// itself): the manifest, its config and its layers, as stored.
func imageSize(raw []byte, size int64) (int64, error) {
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return 0, err
	}
	total := size + m.Config.Size
	for _, l := range m.Layers {
		total += l.Size
	}
	return total, nil
}

// imageSizes remembers the size of each image verified (by repository and
// digest), up to maxImageSizes of them; then it starts again.
type imageSizes struct {
	mu sync.Mutex
	m  map[string]int64
}

const maxImageSizes = 4096

func (s *imageSizes) get(ref string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.m[ref]
	return n, ok
}

func (s *imageSizes) put(ref string, size int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil || len(s.m) >= maxImageSizes {
		s.m = map[string]int64{}
	}
	s.m[ref] = size
}
