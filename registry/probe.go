package registry

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// probeSize is how many bytes ProbeUpload writes: enough that a registry
// whose disk is full cannot take them.
const probeSize = 64 << 10

// ProbeUpload asks the registry of repo ("127.0.0.1:5000/app") to take an
// upload into repo, and cancels it: it starts a blob upload, sends a chunk
// of it and deletes the upload, so nothing stays behind. It is how a push
// that failed in BuildKit — which passes the registry's answer along as
// text, without the registry's detail — is asked again: its error is the
// registry's own *transport.Error, with every word the registry said (the
// disk that is full, the quota that is spent). nil when the registry took
// the chunk.
func (c *Client) ProbeUpload(ctx context.Context, repo string) error {
	c = c.or()
	r, err := c.repository(repo)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	auth, err := c.keychain.Resolve(r.Registry)
	if err != nil {
		return fmt.Errorf("credentials for %s: %w", r.Registry, err)
	}
	t, err := transport.NewWithContext(ctx, r.Registry, auth, c.transport, []string{r.Scope(transport.PushScope)})
	if err != nil {
		return loginHint(fmt.Errorf("uploading to %s: %w", repo, err), r.RegistryStr())
	}
	client := &http.Client{Transport: t}
	base := &url.URL{Scheme: r.Scheme(), Host: r.RegistryStr(), Path: "/v2/" + r.RepositoryStr() + "/blobs/uploads/"}
	resp, err := do(ctx, client, http.MethodPost, base.String(), nil)
	if err != nil {
		return fmt.Errorf("uploading to %s: %w", repo, err)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusAccepted); err != nil {
		return loginHint(fmt.Errorf("uploading to %s: %w", repo, err), r.RegistryStr())
	}
	loc, err := base.Parse(resp.Header.Get("Location"))
	if err != nil || resp.Header.Get("Location") == "" {
		return fmt.Errorf("uploading to %s: the registry started an upload without a Location (%q)", repo, resp.Header.Get("Location"))
	}
	// Cancel the upload whatever the chunk met: a registry keeps nothing
	// of a cancelled upload.
	defer func() {
		if resp, err := do(context.WithoutCancel(ctx), client, http.MethodDelete, loc.String(), nil); err == nil {
			resp.Body.Close()
		}
	}()
	resp, err = do(ctx, client, http.MethodPatch, loc.String(), bytes.NewReader(make([]byte, probeSize)))
	if err != nil {
		return fmt.Errorf("uploading to %s: %w", repo, err)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusAccepted, http.StatusNoContent); err != nil {
		return fmt.Errorf("uploading to %s: %w", repo, err)
	}
	return nil
}

// do sends one request, with body as its octet-stream content when there
// is one; the caller closes the response's body.
func do(ctx context.Context, c *http.Client, method, u string, body *bytes.Reader) (*http.Response, error) {
	var req *http.Request
	var err error
	if body != nil {
		req, err = http.NewRequestWithContext(ctx, method, u, body)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, u, nil)
	}
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	return c.Do(req)
}
