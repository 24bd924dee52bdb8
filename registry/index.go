package registry

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// IndexManifest is one platform's image in an index: its platform
// ("linux/arm64") and its manifest's digest in the same repository, and
// the attestation manifest pushed with it (empty without one).
type IndexManifest struct {
	Platform    string `json:"platform"`
	Digest      string `json:"digest"`
	Attestation string `json:"attestation,omitempty"`
}

// PushIndex assembles the OCI image index of a module built for several
// platforms — each platform's manifest, as its built event named it, with
// the platform in its descriptor — pushes it to repo (registry/module) by
// digest, checks that the registry resolves it, and returns its digest:
// the module's identity, what dependents are pinned to. The index is a pure
// function of the manifests, so pushing it again (after a restart) gives
// the same digest. BuildKit picks each platform's manifest from it when a
// dependent is built FROM it.
//
// The tag latest names another index, laid out as BuildKit lays out a
// multi-platform build with attestations: the same images, then each
// platform's attestation manifest (IndexManifest.Attestation), annotated
// with the image it attests, and annotations on the index itself (the
// revision built, which changes with every commit and so stays out of the
// identity). Without attestations and annotations the tag names the
// identity index.
func (c *Client) PushIndex(ctx context.Context, repo string, manifests []IndexManifest, annotations map[string]string) (string, error) {
	c = c.or()
	r, err := c.repository(repo)
	if err != nil {
		return "", err
	}
	ropts := c.remote(ctx)
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, m := range manifests {
		ref := r.Digest(m.Digest)
		desc, err := remote.Get(ref, ropts...)
		if err != nil {
			return "", fmt.Errorf("reading %s's manifest %s: %w", m.Platform, ref, err)
		}
		if !desc.MediaType.IsImage() {
			return "", fmt.Errorf("%s's image %s is a %s, not one image's manifest", m.Platform, ref, desc.MediaType)
		}
		img, err := desc.Image()
		if err != nil {
			return "", fmt.Errorf("reading %s's image %s: %w", m.Platform, ref, err)
		}
		p, err := v1.ParsePlatform(m.Platform)
		if err != nil {
			return "", fmt.Errorf("platform %q: %w", m.Platform, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{MediaType: desc.MediaType, Platform: p},
		})
	}
	dg, err := idx.Digest()
	if err != nil {
		return "", fmt.Errorf("digesting the index of %s: %w", repo, err)
	}
	if err := remote.WriteIndex(r.Digest(dg.String()), idx, ropts...); err != nil {
		return "", loginHint(fmt.Errorf("pushing the index %s@%s: %w", repo, dg, err), r.RegistryStr())
	}
	if err := c.tagIndex(ctx, r, idx, manifests, annotations); err != nil {
		return "", err
	}
	got, err := c.Resolve(ctx, repo+"@"+dg.String())
	if err != nil {
		return "", fmt.Errorf("verifying the index: %w", err)
	}
	if got != dg.String() {
		return "", fmt.Errorf("the registry resolves %s@%s to %s", repo, dg, got)
	}
	return dg.String(), nil
}

// tagIndex points repo:latest at the identity index idx with each
// platform's attestation manifest added and annotations on it (or at idx
// itself when there are neither).
func (c *Client) tagIndex(ctx context.Context, r name.Repository, idx v1.ImageIndex, manifests []IndexManifest, annotations map[string]string) error {
	ropts := c.remote(ctx)
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	tagged := im.DeepCopy()
	for i, m := range manifests {
		if m.Attestation == "" {
			continue
		}
		desc, err := remote.Head(r.Digest(m.Attestation), ropts...)
		if err != nil {
			return loginHint(fmt.Errorf("reading %s's attestation manifest %s: %w", m.Platform, m.Attestation, err), r.RegistryStr())
		}
		tagged.Manifests = append(tagged.Manifests, v1.Descriptor{
			MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest,
			Annotations: map[string]string{
				AnnotationReferenceType:   ReferenceTypeAttestation,
				AnnotationReferenceDigest: im.Manifests[i].Digest.String(),
			},
			Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"},
		})
	}
	if len(annotations) > 0 {
		tagged.Annotations = annotations
	}
	raw, err := json.Marshal(tagged)
	if err != nil {
		return err
	}
	if err := remote.Put(r.Tag("latest"), rawManifest{raw, types.OCIImageIndex}, ropts...); err != nil {
		return loginHint(fmt.Errorf("tagging the index of %s as latest: %w", r, err), r.RegistryStr())
	}
	return nil
}
