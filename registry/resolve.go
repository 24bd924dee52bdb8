package registry

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// backoff bounds go-containerregistry's own retries of temporary failures:
// callers here (the agent) retry infrastructure failures themselves, with
// their own delay and bound.
var backoff = remote.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 2}

func remoteOptions(ctx context.Context) []remote.Option {
	return []remote.Option{remote.WithContext(ctx), remote.WithRetryBackoff(backoff)}
}

func parse(ref string, insecure bool) (name.Reference, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("parsing reference %q: %w", ref, err)
	}
	return r, nil
}

// Resolve returns the digest of the manifest ref names ("sha256:…"), asking
// the registry with a HEAD request. For a reference by digest it confirms
// that the registry holds that manifest. insecure allows plain HTTP to any
// host (loopback and private hosts always get it).
func Resolve(ctx context.Context, ref string, insecure bool) (string, error) {
	r, err := parse(ref, insecure)
	if err != nil {
		return "", err
	}
	desc, err := remote.Head(r, remoteOptions(ctx)...)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", ref, err)
	}
	return desc.Digest.String(), nil
}

// Size returns the bytes an image occupies in the registry: its manifest,
// config and layers (compressed, as stored). For an index it is the sum over
// its images.
func Size(ctx context.Context, ref string, insecure bool) (int64, error) {
	r, err := parse(ref, insecure)
	if err != nil {
		return 0, err
	}
	desc, err := remote.Get(r, remoteOptions(ctx)...)
	if err != nil {
		return 0, fmt.Errorf("fetching %s: %w", ref, err)
	}
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return 0, fmt.Errorf("reading index %s: %w", ref, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return 0, fmt.Errorf("reading index %s: %w", ref, err)
		}
		total := desc.Size
		for _, m := range im.Manifests {
			if !m.MediaType.IsImage() {
				total += m.Size
				continue
			}
			n, err := Size(ctx, r.Context().Digest(m.Digest.String()).String(), insecure)
			if err != nil {
				return 0, err
			}
			total += n
		}
		return total, nil
	}
	img, err := desc.Image()
	if err != nil {
		return 0, fmt.Errorf("reading image %s: %w", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return 0, fmt.Errorf("reading manifest %s: %w", ref, err)
	}
	total := desc.Size + m.Config.Size
	for _, l := range m.Layers {
		total += l.Size
	}
	return total, nil
}

// Ping checks that the registry at host ("127.0.0.1:5000") answers its API
// root, /v2/. Any answer below 500 counts (401 asks for credentials, which
// is an answer); a 5xx is returned as a *transport.Error, so [IsInfra]
// classifies what Ping returns. insecure tries HTTPS without verifying the
// certificate, then plain HTTP.
func Ping(ctx context.Context, host string, insecure bool) error {
	reg, err := name.NewRegistry(host)
	if err != nil {
		return fmt.Errorf("parsing registry %q: %w", host, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	schemes := []string{reg.Scheme()}
	if insecure && reg.Scheme() == "https" {
		schemes = append(schemes, "http")
	}
	for _, scheme := range schemes {
		if err = ping(ctx, scheme+"://"+reg.RegistryStr()+"/v2/", insecure); err == nil {
			return nil
		}
	}
	return fmt.Errorf("pinging %s: %w", host, err)
}

func ping(ctx context.Context, url string, insecure bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	defer t.CloseIdleConnections()
	if insecure {
		t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // asked for
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode >= 500 {
		return &transport.Error{StatusCode: resp.StatusCode, Request: req}
	}
	return nil
}
