package registry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Client is how meshbuild speaks to registries: with which credentials,
// whether plain HTTP and unverified TLS are allowed, over which transport.
// It is configured once, from [ClientOption]s, and shared: every call made
// through it (resolving a digest, sizing an image, pinging a registry,
// pushing the busybox base) sends the same credentials BuildKit pushes
// with.
//
// A nil *Client is the default client: credentials from the docker config
// keychain, HTTPS except to loopback and private hosts.
//
// Calls share connections and token exchanges: the client keeps one
// go-containerregistry Puller and Pusher (remote.Reuse), so that a registry
// is pinged and a token fetched once per repository, not once per call.
type Client struct {
	keychain  authn.Keychain
	insecure  bool
	transport http.RoundTripper

	puller *remote.Puller
	pusher *remote.Pusher
}

// ClientOption configures a [Client], in the manner of go-containerregistry's
// remote.Option.
type ClientOption func(*Client)

// WithKeychain takes credentials from kc. The default is
// authn.DefaultKeychain: the docker config ($DOCKER_CONFIG/config.json or
// ~/.docker/config.json) and the credential helpers it names — what
// BuildKit's pushes use. authn.NewMultiKeychain combines several.
func WithKeychain(kc authn.Keychain) ClientOption {
	return func(c *Client) {
		if kc != nil {
			c.keychain = kc
		}
	}
}

// WithInsecure allows (insecure=true) plain HTTP to any registry and TLS
// without verifying certificates, as BuildKit's registry.insecure does.
// Loopback and private hosts are spoken to over plain HTTP in any case
// (go-containerregistry's rule).
func WithInsecure(insecure bool) ClientOption {
	return func(c *Client) { c.insecure = insecure }
}

// WithTransport sends every request through t instead of
// remote.DefaultTransport. With [WithInsecure], t's TLS verification is
// left to t when it is not an *http.Transport.
func WithTransport(t http.RoundTripper) ClientOption {
	return func(c *Client) {
		if t != nil {
			c.transport = t
		}
	}
}

// NewClient returns a client configured by opts; every default is in
// [Client]'s doc.
func NewClient(opts ...ClientOption) *Client {
	c := &Client{keychain: authn.DefaultKeychain, transport: remote.DefaultTransport}
	for _, o := range opts {
		o(c)
	}
	if c.insecure {
		if t, ok := c.transport.(*http.Transport); ok {
			t = t.Clone()
			t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // asked for
			c.transport = t
		}
	}
	// NewPuller and NewPusher make no request and fail only on a bad
	// option, which these are not; without them every call starts afresh.
	c.puller, _ = remote.NewPuller(c.options()...)
	c.pusher, _ = remote.NewPusher(c.options()...)
	return c
}

// or returns c, or the default client for nil.
func (c *Client) or() *Client {
	if c == nil {
		return NewClient()
	}
	return c
}

// Insecure reports whether c allows plain HTTP and unverified TLS to any
// host, so that a push through BuildKit is told the same.
func (c *Client) Insecure() bool { return c != nil && c.insecure }

// backoff bounds go-containerregistry's own retries of temporary failures:
// callers here (the agent) retry infrastructure failures themselves, with
// their own delay and bound.
var backoff = remote.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 2}

func (c *Client) remote(ctx context.Context) []remote.Option {
	opts := append(c.options(), remote.WithContext(ctx))
	if c.puller != nil {
		opts = append(opts, remote.Reuse(c.puller))
	}
	if c.pusher != nil {
		opts = append(opts, remote.Reuse(c.pusher))
	}
	return opts
}

// options are the client's remote options but the context.
func (c *Client) options() []remote.Option {
	return []remote.Option{
		remote.WithRetryBackoff(backoff),
		remote.WithAuthFromKeychain(c.keychain), remote.WithTransport(c.transport),
	}
}

// names are the options a name is parsed with: plain HTTP for an insecure
// client.
func (c *Client) names() []name.Option {
	if c.insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

func (c *Client) parse(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref, c.names()...)
	if err != nil {
		return nil, fmt.Errorf("parsing reference %q: %w", ref, err)
	}
	return r, nil
}

// repository parses repo ("127.0.0.1:5000/app") as a repository.
func (c *Client) repository(repo string) (name.Repository, error) {
	r, err := name.NewRepository(repo, c.names()...)
	if err != nil {
		return name.Repository{}, fmt.Errorf("parsing repository %q: %w", repo, err)
	}
	return r, nil
}

// Resolve returns the digest of the manifest ref names ("sha256:…"), asking
// the registry with a HEAD request. For a reference by digest it confirms
// that the registry holds that manifest.
func (c *Client) Resolve(ctx context.Context, ref string) (string, error) {
	c = c.or()
	r, err := c.parse(ref)
	if err != nil {
		return "", err
	}
	desc, err := remote.Head(r, c.remote(ctx)...)
	if err != nil {
		return "", loginHint(fmt.Errorf("resolving %s: %w", ref, err), r.Context().RegistryStr())
	}
	return desc.Digest.String(), nil
}

// Head returns the descriptor of the manifest ref names (its digest, size
// and media type), asking the registry with a HEAD request.
func (c *Client) Head(ctx context.Context, ref string) (*v1.Descriptor, error) {
	c = c.or()
	r, err := c.parse(ref)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Head(r, c.remote(ctx)...)
	if err != nil {
		return nil, loginHint(fmt.Errorf("resolving %s: %w", ref, err), r.Context().RegistryStr())
	}
	return desc, nil
}

// fetch gets the manifest ref names, with its descriptor, and ref parsed;
// a registry's error is said as doing ref ("pulling", "fetching"), with a
// hint to log in where it refused.
func (c *Client) fetch(ctx context.Context, ref, doing string) (name.Reference, *remote.Descriptor, error) {
	r, err := c.parse(ref)
	if err != nil {
		return nil, nil, err
	}
	desc, err := remote.Get(r, c.remote(ctx)...)
	if err != nil {
		return nil, nil, loginHint(fmt.Errorf("%s %s: %w", doing, ref, err), r.Context().RegistryStr())
	}
	return r, desc, nil
}

// Get fetches the manifest ref names, with its descriptor, for a caller
// that reads the image or index further (a node pulling into its layout).
func (c *Client) Get(ctx context.Context, ref string) (*remote.Descriptor, error) {
	c = c.or()
	_, desc, err := c.fetch(ctx, ref, "pulling")
	if err != nil {
		return nil, err
	}
	return desc, nil
}

// Tag points tag, in the repository of ref, at the manifest ref names
// (by digest): a tag moved to an image already pushed, without pushing
// it again.
func (c *Client) Tag(ctx context.Context, ref, tag string) error {
	c = c.or()
	_, desc, err := c.fetch(ctx, ref, "fetching")
	if err != nil {
		return err
	}
	return c.TagFetched(ctx, ref, desc, tag)
}

// TagFetched is Tag of a manifest the caller has already fetched (desc, as
// Get returned it for ref): the same, one round trip fewer.
func (c *Client) TagFetched(ctx context.Context, ref string, desc *remote.Descriptor, tag string) error {
	c = c.or()
	r, err := c.parse(ref)
	if err != nil {
		return err
	}
	t := r.Context().Tag(tag)
	if err := remote.Tag(t, desc, c.remote(ctx)...); err != nil {
		return loginHint(fmt.Errorf("tagging %s as %s: %w", ref, t, err), r.Context().RegistryStr())
	}
	return nil
}

// Size returns the bytes an image occupies in the registry: its manifest,
// config and layers (compressed, as stored). For an index it is the sum over
// its images.
func (c *Client) Size(ctx context.Context, ref string) (int64, error) {
	c = c.or()
	r, desc, err := c.fetch(ctx, ref, "fetching")
	if err != nil {
		return 0, err
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
			n, err := c.Size(ctx, r.Context().Digest(m.Digest.String()).String())
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
// root, /v2/, with the client's credentials: nil when it does. A registry
// that wants credentials the keychain does not have (or refuses them)
// returns a 401 *transport.Error, which [IsRejected] classifies; one that
// cannot be reached or answers 5xx returns what [IsInfra] classifies.
func (c *Client) Ping(ctx context.Context, host string) error {
	c = c.or()
	reg, err := name.NewRegistry(host, c.names()...)
	if err != nil {
		return fmt.Errorf("parsing registry %q: %w", host, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.ping(ctx, reg); err != nil {
		return loginHint(fmt.Errorf("pinging %s: %w", host, err), reg.RegistryStr())
	}
	return nil
}

func (c *Client) ping(ctx context.Context, reg name.Registry) error {
	auth, err := c.keychain.Resolve(reg)
	if err != nil {
		return fmt.Errorf("credentials for %s: %w", reg, err)
	}
	// The handshake pings /v2/ once anonymously for the challenge, then
	// wraps the transport with the credentials it asks for; the request
	// below is the one that shows whether they are accepted.
	t, err := transport.NewWithContext(ctx, reg, auth, c.transport, nil)
	if err != nil {
		return err
	}
	// https: the handshake's transport switches to http when that is what
	// answered.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+reg.RegistryStr()+"/v2/", nil)
	if err != nil {
		return err
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return transport.CheckError(resp, http.StatusOK)
}

// loginHint adds to a 401 what to do about it: the registry wants
// credentials the keychain does not hold, or refused those it sent.
func loginHint(err error, host string) error {
	var te *transport.Error
	if !errors.As(err, &te) || te.StatusCode != http.StatusUnauthorized {
		return err
	}
	return fmt.Errorf("%w (401 Unauthorized: registry %s wants a login the docker config does not hold or that it refuses; run `docker login %s`, or point DOCKER_CONFIG at a config.json that has it)", err, host, host)
}
