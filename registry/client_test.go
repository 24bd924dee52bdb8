package registry_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/meshbuild/meshbuild/registry"
)

const user, password = "builder", "s3cret"

// loginRegistry serves the embedded registry behind HTTP basic auth, as a
// registry that needs a login does (distribution's htpasswd, Harbor's basic
// realm), and returns its host.
func loginRegistry(t *testing.T) string {
	t.Helper()
	inner := registry.New(t.TempDir())
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="meshbuild-test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`))
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

// dockerConfig points DOCKER_CONFIG at a temp dir whose config.json holds
// auths (host → "user:password"), the file `docker login` writes.
func dockerConfig(t *testing.T, auths map[string]string) {
	t.Helper()
	dir := t.TempDir()
	var entries []string
	for host, up := range auths {
		entries = append(entries, `"`+host+`":{"auth":"`+base64.StdEncoding.EncodeToString([]byte(up))+`"}`)
	}
	cfg := `{"auths":{` + strings.Join(entries, ",") + `}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
}

// TestClientLogin: against a registry that needs a login, the client with
// the docker config keychain (the default) pushes, resolves, sizes and pings
// with the credentials `docker login` saved; without them every call fails
// with the registry's 401, classified as a refusal.
func TestClientLogin(t *testing.T) {
	ctx := context.Background()
	host := loginRegistry(t)
	dockerConfig(t, map[string]string{host: user + ":" + password})

	c := registry.NewClient()
	dgst, err := pushRandom(ctx, host+"/busybox:latest")
	if err != nil {
		t.Fatalf("push with the keychain: %v", err)
	}
	ref := host + "/busybox:latest"
	if got, err := c.Resolve(ctx, ref); err != nil || got != dgst {
		t.Errorf("Resolve(%s) with the keychain = %s, %v; want %s", ref, got, err, dgst)
	}
	if n, err := c.Size(ctx, ref); err != nil || n <= 0 {
		t.Errorf("Size(%s) with the keychain = %d, %v", ref, n, err)
	}
	if err := c.Ping(ctx, host); err != nil {
		t.Errorf("Ping(%s) with the keychain: %v", host, err)
	}

	for _, tc := range []struct {
		name string
		c    *registry.Client
		set  func(t *testing.T)
	}{
		{"no keychain", registry.NewClient(registry.WithKeychain(authn.NewMultiKeychain())), func(*testing.T) {}},
		{"docker config without the host", registry.NewClient(), func(t *testing.T) {
			dockerConfig(t, map[string]string{"other.example": user + ":" + password})
		}},
		{"wrong password", registry.NewClient(), func(t *testing.T) {
			dockerConfig(t, map[string]string{host: user + ":wrong"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.set(t)
			_, rerr := tc.c.Resolve(ctx, ref)
			_, serr := tc.c.Size(ctx, ref)
			perr := tc.c.Ping(ctx, host)
			for call, err := range map[string]error{"Resolve": rerr, "Size": serr, "Ping": perr} {
				var te *transport.Error
				if !errors.As(err, &te) || te.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s without credentials = %v, want a 401 *transport.Error", call, err)
					continue
				}
				if !registry.IsRejected(err) || registry.IsInfra(err) {
					t.Errorf("%s: %v is not classified as a refusal", call, err)
				}
				if msg := err.Error(); !strings.Contains(msg, "401 Unauthorized") || !strings.Contains(msg, "docker login "+host) {
					t.Errorf("%s: %q does not say 401 and how to log in to %s", call, err, host)
				}
			}
		})
	}
}

// TestClientInsecure: Insecure is what the client was made with, nil
// included, so BuildKit's push is told the same.
func TestClientInsecure(t *testing.T) {
	var nilClient *registry.Client
	for _, tc := range []struct {
		c    *registry.Client
		want bool
	}{
		{nilClient, false},
		{registry.NewClient(), false},
		{registry.NewClient(registry.WithInsecure(true)), true},
	} {
		if got := tc.c.Insecure(); got != tc.want {
			t.Errorf("Insecure() = %v, want %v", got, tc.want)
		}
	}
	// A nil client is the default one.
	host, _ := newRegistry(t)
	if _, err := pushRandom(context.Background(), host+"/busybox:latest"); err != nil {
		t.Fatal(err)
	}
	if _, err := nilClient.Resolve(context.Background(), host+"/busybox:latest"); err != nil {
		t.Errorf("nil client Resolve: %v", err)
	}
}

// pushRandom pushes a small random image to ref with the docker config's
// credentials (the keychain BuildKit pushes with) and returns its digest.
func pushRandom(ctx context.Context, ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", err
	}
	img, err := random.Image(256, 1)
	if err != nil {
		return "", err
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return "", err
	}
	d, err := img.Digest()
	return d.String(), err
}
