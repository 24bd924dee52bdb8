package registry

import (
	"bytes"
	"context"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// PutNote pushes, under ref (a tag), an empty image whose manifest carries
// annotations: a note about the repository's other content that a later
// Note reads back in one request. Pushing again moves the tag, so the
// repository holds one note per tag, the older ones untagged.
func (c *Client) PutNote(ctx context.Context, ref string, annotations map[string]string) error {
	c = c.or()
	r, err := c.parse(ref)
	if err != nil {
		return err
	}
	img, ok := mutate.Annotations(empty.Image, annotations).(v1.Image)
	if !ok {
		return fmt.Errorf("annotating the note %s", ref)
	}
	if err := remote.Write(r, img, c.remote(ctx)...); err != nil {
		return loginHint(fmt.Errorf("pushing the note %s: %w", ref, err), r.Context().RegistryStr())
	}
	return nil
}

// Note returns the annotations of the manifest ref names (a note PutNote
// pushed).
func (c *Client) Note(ctx context.Context, ref string) (map[string]string, error) {
	desc, err := c.Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		return nil, fmt.Errorf("reading the note %s: %w", ref, err)
	}
	return m.Annotations, nil
}
