package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// # Attestations where tools look
//
// An image is pushed with its attestations (provenance, SBOM) the way
// BuildKit lays them out: an index holding the image manifest and an
// attestation manifest annotated vnd.docker.reference.type=
// attestation-manifest and vnd.docker.reference.digest=<the image>. The
// tag names that index, so that `docker buildx imagetools inspect
// REPO:latest` finds the provenance. The attestation manifest is also an
// OCI 1.1 referrer of the image: it carries the image as its subject, and
// the registry lists it under GET /v2/<repo>/referrers/<image digest>, or,
// on a registry without the referrers API, in the index tagged
// sha256-<hex of the image digest> (the referrers tag schema), which
// Refer keeps.
//
// The digest the mesh pins dependents to is the image manifest's (or, for a
// module built for several platforms, the index of the images alone): it
// is reproducible, the attestations (which record when they were made) are
// not. Identity recovers it from a tag.

// Annotations BuildKit puts on an attestation manifest's descriptor in an
// index (util/attestation).
const (
	AnnotationReferenceType   = "vnd.docker.reference.type"
	AnnotationReferenceDigest = "vnd.docker.reference.digest"
	ReferenceTypeAttestation  = "attestation-manifest"
)

// rawManifest is a manifest pushed as it is (remote.Taggable).
type rawManifest struct {
	raw []byte
	mt  types.MediaType
}

func (r rawManifest) RawManifest() ([]byte, error)        { return r.raw, nil }
func (r rawManifest) MediaType() (types.MediaType, error) { return r.mt, nil }

// Refer makes the manifest at ref (by digest), which names its subject,
// listed among the subject's referrers: on a registry with the referrers
// API the registry did so when it was pushed, and putting it again changes
// nothing; on one without, the index under the referrers tag
// (sha256-<hex>) gains its descriptor. A manifest without a subject is
// refused.
func (c *Client) Refer(ctx context.Context, ref string) error {
	c = c.or()
	_, desc, err := c.fetch(ctx, ref, "fetching")
	if err != nil {
		return err
	}
	return c.ReferFetched(ctx, ref, desc)
}

// ReferFetched is Refer of a manifest the caller has already fetched
// (desc, as Get returned it for ref): the same, one round trip fewer.
func (c *Client) ReferFetched(ctx context.Context, ref string, desc *remote.Descriptor) error {
	c = c.or()
	r, err := c.parse(ref)
	if err != nil {
		return err
	}
	var m ocispec.Manifest // an index's subject reads the same
	if err := json.Unmarshal(desc.Manifest, &m); err != nil || m.Subject == nil {
		return fmt.Errorf("%s names no subject: it cannot be a referrer", ref)
	}
	// go-containerregistry's Put keeps the referrers tag of the subject
	// when the registry has no referrers API (remote.commitSubjectReferrers).
	if err := remote.Put(r.Context().Digest(desc.Digest.String()), rawManifest{desc.Manifest, desc.MediaType}, c.remote(ctx)...); err != nil {
		return loginHint(fmt.Errorf("putting %s as a referrer of %s: %w", ref, m.Subject.Digest, err), r.Context().RegistryStr())
	}
	return nil
}

// Referrers lists the manifests that name the manifest at ref (by digest)
// as their subject: the registry's referrers API, else the referrers tag.
func (c *Client) Referrers(ctx context.Context, ref string) ([]v1.Descriptor, error) {
	c = c.or()
	r, err := c.parse(ref)
	if err != nil {
		return nil, err
	}
	d, ok := r.(name.Digest)
	if !ok {
		return nil, fmt.Errorf("referrers of %s: want a reference by digest", ref)
	}
	idx, err := remote.Referrers(d, c.remote(ctx)...)
	if err != nil {
		return nil, loginHint(fmt.Errorf("listing the referrers of %s: %w", ref, err), r.Context().RegistryStr())
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading the referrers of %s: %w", ref, err)
	}
	return im.Manifests, nil
}

// Identity returns the digest the mesh pins to for what ref names: for an
// index that holds attestation manifests (what a tag names), the image in
// it when it holds one, else the digest of the index of its images alone
// (what PushIndex pins dependents to); for anything else, its own digest.
func (c *Client) Identity(ctx context.Context, ref string) (string, error) {
	c = c.or()
	desc, err := c.Get(ctx, ref)
	if err != nil {
		return "", err
	}
	if !desc.MediaType.IsIndex() {
		return desc.Digest.String(), nil
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		return "", fmt.Errorf("reading the index %s: %w", ref, err)
	}
	images := imagesOf(im.Manifests)
	switch {
	case len(images) == len(im.Manifests):
		return desc.Digest.String(), nil // no attestation in it
	case len(images) == 1:
		return images[0].Digest.String(), nil
	}
	pure := pureIndex(images)
	raw, err := json.Marshal(pure)
	if err != nil {
		return "", err
	}
	h, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return "", err
	}
	return h.String(), nil
}

// imagesOf drops the attestation manifests of an index's descriptors.
func imagesOf(ds []v1.Descriptor) []v1.Descriptor {
	var out []v1.Descriptor
	for _, d := range ds {
		if d.Annotations[AnnotationReferenceType] != ReferenceTypeAttestation {
			out = append(out, d)
		}
	}
	return out
}

// pureIndex is the OCI index of images alone, as PushIndex assembles it
// (mutate.AppendManifests over empty.Index): the images' descriptors as the
// tag's index holds them (tagIndex copies them).
func pureIndex(images []v1.Descriptor) v1.IndexManifest {
	return v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: images}
}
