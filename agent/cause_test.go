package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/moby/buildkit/util/grpcerrors"
	"google.golang.org/grpc/codes"

	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// faulty is a real registry (the embedded one) behind a wrapper that
// answers some requests itself, as a registry in trouble does.
type faulty struct {
	inner http.Handler
	// fault, when it returns a status, answers the request with it and
	// the body of distribution's errors it writes (nil: a plain answer).
	fault func(r *http.Request) (int, error)
	hits  atomic.Int32
}

func (f *faulty) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if code, body := f.fault(r); code != 0 {
		f.hits.Add(1)
		if body == nil {
			http.Error(w, http.StatusText(code), code)
			return
		}
		// As distribution answers: its error envelope, with the status
		// the error's code carries or the one given.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = errcode.ServeJSON(&statusKept{w}, body)
		return
	}
	f.inner.ServeHTTP(w, r)
}

// statusKept lets errcode.ServeJSON write its body after the status was
// written.
type statusKept struct{ http.ResponseWriter }

func (s *statusKept) WriteHeader(int) {}

func isBlobUpload(r *http.Request) bool {
	return strings.Contains(r.URL.Path, "/blobs/uploads/") && r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodDelete
}

func isManifestPut(r *http.Request) bool {
	return strings.Contains(r.URL.Path, "/manifests/") && r.Method == http.MethodPut
}

// Every failure of a push is classified by its cause, against a real
// registry that answers as a registry in trouble does, and a real
// buildkitd pushing to it: 5xx, 429 and a full disk are infrastructure
// (retried within --retry-for) with the registry's own words in the
// message — "no space left on device" from the detail BuildKit drops —
// and a 4xx that cannot succeed is the push's (final).
func TestPushFailuresAreClassifiedByCause(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)

	diskFull := errcode.ErrorCodeUnknown.WithDetail("write /var/lib/registry/docker/registry/v2/repositories/app/_uploads/data: no space left on device")
	cases := []struct {
		name  string
		fault func(r *http.Request) (int, error)
		want  error
		words []string
	}{
		{"blob upload answered 500", func(r *http.Request) (int, error) {
			if isBlobUpload(r) {
				return http.StatusInternalServerError, nil
			}
			return 0, nil
		}, ErrInfra, []string{"registry failure", "500"}},
		{"blob upload answered 503", func(r *http.Request) (int, error) {
			if isBlobUpload(r) {
				return http.StatusServiceUnavailable, nil
			}
			return 0, nil
		}, ErrInfra, []string{"503"}},
		{"manifest answered 429", func(r *http.Request) (int, error) {
			if isManifestPut(r) {
				return http.StatusTooManyRequests, errcode.ErrorCodeTooManyRequests
			}
			return 0, nil
		}, ErrInfra, []string{"registry rate limit", "429"}},
		{"disk full", func(r *http.Request) (int, error) {
			if isBlobUpload(r) && r.Method != http.MethodPost {
				return http.StatusInternalServerError, diskFull
			}
			return 0, nil
		}, ErrInfra, []string{"disk full", "no space left on device"}},
		{"manifest invalid (400)", func(r *http.Request) (int, error) {
			if isManifestPut(r) {
				return http.StatusBadRequest, errcode.ErrorCodeManifestInvalid.WithDetail("schema rejected by policy")
			}
			return 0, nil
		}, ErrPush, []string{"registry refusal", "400"}},
		{"name unknown (404)", func(r *http.Request) (int, error) {
			if isBlobUpload(r) || isManifestPut(r) {
				return http.StatusNotFound, errcode.ErrorCodeNameUnknown
			}
			return 0, nil
		}, ErrPush, []string{"registry refusal", "404"}},
		{"denied (403)", func(r *http.Request) (int, error) {
			if isBlobUpload(r) || isManifestPut(r) {
				return http.StatusForbidden, errcode.ErrorCodeDenied
			}
			return 0, nil
		}, ErrPush, []string{"registry refusal", "403"}},
	}
	hosts := []string{host}
	faults := make([]*faulty, len(cases))
	for i, tc := range cases {
		faults[i] = &faulty{inner: registry.New(t.TempDir()), fault: tc.fault}
		srv := httptest.NewServer(faults[i])
		t.Cleanup(srv.Close)
		hosts = append(hosts, strings.TrimPrefix(srv.URL, "http://"))
	}
	bk := newBuildKit(t, testenv.Buildkitd(t, hosts...))
	base := testenv.Busybox(t, host)
	bases := []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}
	dir := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nRUN echo hi > /hi\n"})

	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out lines
			start := time.Now()
			_, err := bk.Build(ctx, BuildRequest{ContextDir: dir, Ask: mesh.Ask{Image: hosts[i+1] + "/app", Bases: bases}, Tag: "x", Log: out.add})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Build = %v, want %v\n%s", err, tc.want, out.String())
			}
			if faults[i].hits.Load() == 0 {
				t.Fatalf("the fault was never met: the test proves nothing")
			}
			for _, w := range tc.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("message %q is more than one line", err)
			}
			t.Logf("%s after %s", err, time.Since(start).Round(time.Millisecond))
		})
	}
}

// The causes table, row by row, on the errors each row is for (as they
// arrive: BuildKit's as text, go-containerregistry's typed).
func TestTheCausesTable(t *testing.T) {
	pushText := func(status string, words string) error {
		return fmt.Errorf("failed to push 127.0.0.1:5000/app:x: unexpected status from PUT request to http://127.0.0.1:5000/v2/app/blobs/uploads/0d9?digest=sha256:abc: %s\n%s", status, words)
	}
	for _, tc := range []struct {
		name string
		err  error
		step step
		want error
		row  string
	}{
		{"daemon gone", grpcerrors.WrapCode(errors.New("connection closed"), codes.Unavailable), stepSolve, ErrInfra, "buildkitd unreachable"},
		{"push 500", pushText("500 Internal Server Error", "unknown: unknown error"), stepPush, ErrInfra, "registry failure"},
		{"push 502", pushText("502 Bad Gateway", ""), stepPush, ErrInfra, "registry failure"},
		{"push 429", pushText("429 Too Many Requests", "toomanyrequests: slow down"), stepPush, ErrInfra, "registry rate limit"},
		{"push 408", pushText("408 Request Timeout", ""), stepPush, ErrInfra, "registry timeout"},
		{"push 404 blob upload unknown, disk full in the detail", errors.Join(pushText("404 Not Found", "blob upload unknown: blob upload unknown to registry"),
			errors.New("uploading to 127.0.0.1:5000/app: PATCH http://127.0.0.1:5000/v2/app/blobs/uploads/x: UNKNOWN: unknown error; write /data: no space left on device")), stepPush, ErrInfra, "disk full"},
		{"push 404 name unknown", pushText("404 Not Found", "name unknown: repository name not known to registry"), stepPush, ErrPush, "registry refusal"},
		{"push 401", pushText("401 Unauthorized", "unauthorized: authentication required"), stepPush, ErrPush, "registry refusal"},
		{"push 400 manifest invalid", pushText("400 Bad Request", "manifest invalid: manifest invalid"), stepPush, ErrPush, "registry refusal"},
		{"push refused connection", errors.New("failed to push x: failed to do request: Put \"http://127.0.0.1:1/v2/\": dial tcp 127.0.0.1:1: connect: connection refused"), stepPush, ErrInfra, "registry unreachable"},
		{"push timed out", errors.New("failed to push x: failed to do request: Put \"http://r/v2/\": net/http: TLS handshake timeout"), stepPush, ErrInfra, "registry unreachable"},
		{"base 404", errors.New("failed to resolve source metadata for r/base@sha256:00: r/base@sha256:00: not found: unexpected status code http://r/v2/base/manifests/sha256:00: 404 Not Found"), stepSolve, ErrBuild, "a base refused"},
		{"base 503", errors.New("failed to resolve source metadata for r/base: unexpected status from HEAD request to http://r/v2/base/manifests/latest: 503 Service Unavailable"), stepSolve, ErrInfra, "registry failure"},
		{"verify 5xx", &registryStatusErr{503}, stepRegistry, ErrInfra, "registry failure"},
		{"verify 404", &registryStatusErr{404}, stepRegistry, ErrPush, "registry refusal"},
		{"verify unreadable", errors.New("unexpected media type"), stepRegistry, ErrPush, "the push"},
		{"build", errors.New("something odd"), stepSolve, ErrBuild, "the build"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := classOf(&failure{err: tc.err, step: tc.step})
			if c.class != tc.want || c.name != tc.row {
				t.Fatalf("classOf = %s (%v), want %s (%v)", c.name, c.class, tc.row, tc.want)
			}
		})
	}
}

// registryStatusErr is an error in the words go-containerregistry gives an
// answer without a body.
type registryStatusErr struct{ code int }

func (e *registryStatusErr) Error() string {
	return fmt.Sprintf("GET http://r/v2/app/manifests/sha256:00: unexpected status code %d %s", e.code, http.StatusText(e.code))
}

// The host an unreachable error names: a URL's first (a default port
// dropped), else the address dialled, else the name looked up.
func TestUnreachableHostIsTheOneTheErrorNames(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{`failed to load cache key: Get "https://example.com/file": dial tcp: lookup example.com on 10.255.255.53:53: no such host`, "example.com"},
		{`failed to do request: Head "https://registry-1.docker.io:443/v2/library/alpine/manifests/latest": dial tcp 1.2.3.4:443: i/o timeout`, "registry-1.docker.io"},
		{`failed to push 127.0.0.1:5000/app: failed to do request: Head "http://127.0.0.1:5000/v2/app/blobs/sha256:ab": dial tcp 127.0.0.1:5000: connect: connection refused`, "127.0.0.1:5000"},
		{`dial tcp 10.0.0.7:8443: connect: no route to host`, "10.0.0.7:8443"},
		{`dial tcp: lookup git.example on 127.0.0.53:53: no such host`, "git.example"},
		{`connection reset by peer`, ""},
	} {
		if got := unreachableHost(tc.text); got != tc.want {
			t.Errorf("unreachableHost(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
	if !askRegistry([]string{"docker.io"}, "registry-1.docker.io") || askRegistry([]string{"127.0.0.1:5000"}, "example.com") {
		t.Error("askRegistry: want registry-1.docker.io counted as docker.io, example.com as none of the farm's")
	}
}
