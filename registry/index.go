package registry

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// IndexManifest is one platform's image in an index: its platform
// ("linux/arm64") and its manifest's digest in the same repository.
type IndexManifest struct {
	Platform string `json:"platform"`
	Digest   string `json:"digest"`
}

// PushIndex assembles the OCI image index of a module built for several
// platforms — each platform's manifest, as its built event named it, with
// the platform in its descriptor — pushes it to repo (registry/module)
// under the tag latest, checks that the registry resolves it by digest, and
// returns its digest. The index is a pure function of the manifests, so
// pushing it again (after a restart) gives the same digest. BuildKit picks
// each platform's manifest from it when a dependent is built FROM it.
func (c *Client) PushIndex(ctx context.Context, repo string, manifests []IndexManifest) (string, error) {
	c = c.or()
	var opts []name.Option
	if c.insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.NewRepository(repo, opts...)
	if err != nil {
		return "", fmt.Errorf("parsing repository %q: %w", repo, err)
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
	if err := remote.WriteIndex(r.Tag("latest"), idx, ropts...); err != nil {
		return "", loginHint(fmt.Errorf("pushing the index %s@%s: %w", repo, dg, err), r.RegistryStr())
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
