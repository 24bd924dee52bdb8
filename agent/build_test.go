package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/moby/buildkit/client"

	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/busybox"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// buildContext writes files to a temp dir, the build context.
func buildContext(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func newBuildKit(t *testing.T, addr string) *BuildKit {
	t.Helper()
	bk, err := NewBuildKit(addr, BuildKitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bk.Close() })
	return bk
}

// lines collects build output, safe for concurrent use.
type lines struct {
	mu sync.Mutex
	l  []string
}

func (l *lines) add(s string) { l.mu.Lock(); l.l = append(l.l, s); l.mu.Unlock() }

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.l, "\n")
}

func remoteImage(t *testing.T, ref string) v1.Image {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("fetching %s: %v", ref, err)
	}
	return img
}

func layerDigests(t *testing.T, img v1.Image) []string {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range m.Layers {
		out = append(out, l.Digest.String())
	}
	return out
}

func digestOf(ref string) string { return ref[strings.LastIndex(ref, "@")+1:] }

// A dependent built FROM its base by module name, with a RUN step, is pushed
// by digest; the registry resolves the tag and the digest to it; its layers
// start with the base's. A second build is answered from cache.
func TestBuildFromBase(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	bk := newBuildKit(t, testenv.Buildkitd(t, host))
	base := testenv.Busybox(t, host)

	dir := buildContext(t, map[string]string{
		"Dockerfile": "FROM runtime\nRUN echo built-by-run > /run.txt && cat /run.txt\n" +
			"RUN printf '%9000s\\n' long\nCOPY app.txt /app.txt\n",
		"app.txt": "app",
	})
	req := BuildRequest{
		ContextDir: dir, Tag: "c1",
		Ask: mesh.Ask{Platform: "linux/amd64", Image: host + "/app",
			Bases: []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}},
	}
	var out lines
	req.Log = out.add
	res, err := bk.Build(ctx, req)
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, out.String())
	}
	if res.Ref != host+"/app@"+res.Digest {
		t.Errorf("Ref = %s", res.Ref)
	}
	// The tag names the index of the image and its attestations; the
	// identity behind it is the image.
	for _, ref := range []string{host + "/app:c1", res.Ref} {
		got, err := registry.NewClient().Identity(ctx, ref)
		if err != nil || got != res.Digest {
			t.Errorf("Identity(%s) = %s, %v; want %s", ref, got, err, res.Digest)
		}
	}
	if res.Steps != 4 || res.CacheHits != 0 || res.Bytes <= 0 || res.Duration <= 0 {
		t.Errorf("result %+v: want 4 steps, no cache hits, bytes and a duration", res)
	}
	log := out.String()
	if !strings.Contains(log, "built-by-run") || !strings.Contains(log, "RUN echo built-by-run") {
		t.Errorf("log lacks the RUN step and its output:\n%s", log)
	}
	for _, l := range out.l {
		if len(l) > 4096+16 {
			t.Errorf("a log line of %d bytes passed the bound", len(l))
		}
	}

	baseLayers := layerDigests(t, remoteImage(t, base))
	got := layerDigests(t, remoteImage(t, res.Ref))
	if len(got) <= len(baseLayers) || got[0] != baseLayers[0] {
		t.Errorf("layers %v do not start with the base's %v", got, baseLayers)
	}

	again, err := bk.Build(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if again.Digest != res.Digest || again.CacheHits < 3 {
		t.Errorf("rebuild: digest %s (first %s), %d cache hits of %d steps", again.Digest, res.Digest, again.CacheHits, again.Steps)
	}
}

// pushMarked pushes img plus a layer holding /marker under ref and returns
// the new image's digest and the marker layer's.
func pushMarked(t *testing.T, img v1.Image, ref string) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	writeTar(t, &buf, "marker", "the second image")
	marker := static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer)
	img2, err := mutate.AppendLayers(img, marker)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img2); err != nil {
		t.Fatal(err)
	}
	d, _ := img2.Digest()
	md, _ := marker.Digest()
	return d.String(), md.String()
}

// The ask's base digest is what the dependent is built on, however the
// Dockerfile spells the base and whatever its tag points at by then.
func TestBuildPinsBase(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	bk := newBuildKit(t, testenv.Buildkitd(t, host))

	// The first image under runtime:latest, whose digest the ask names;
	// then a second, different one under the same tag.
	pinned, err := busybox.Push(ctx, host, "runtime")
	if err != nil {
		t.Fatal(err)
	}
	pinnedLayers := layerDigests(t, remoteImage(t, host+"/runtime@"+pinned))
	moved, marker := pushMarked(t, remoteImage(t, host+"/runtime@"+pinned), host+"/runtime:latest")
	if now, _ := registry.NewClient().Resolve(ctx, host+"/runtime:latest"); now != moved || moved == pinned {
		t.Fatalf("runtime:latest = %s, want the second image %s", now, moved)
	}
	bases := []mesh.Base{{Module: "runtime", Image: host + "/runtime", Digest: pinned}}

	for _, tc := range []struct {
		name, from string
		bases      []mesh.Base
		pinned     bool
	}{
		{"module name", "runtime", bases, true},
		{"repository", host + "/runtime", bases, true},
		{"repository:latest", host + "/runtime:latest", bases, true},
		// The control: without the ask's base the tag's image is used.
		{"unpinned", host + "/runtime:latest", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := buildContext(t, map[string]string{
				"Dockerfile": "FROM " + tc.from + "\nRUN ls / > /rootfs.txt\n",
			})
			var out lines
			res, err := bk.Build(ctx, BuildRequest{
				ContextDir: dir, Tag: strings.NewReplacer(" ", "-", ":", "-").Replace(tc.name),
				Ask: mesh.Ask{Image: host + "/dependent", Bases: tc.bases}, Log: out.add,
			})
			if err != nil {
				t.Fatalf("Build: %v\n%s", err, out.String())
			}
			got := layerDigests(t, remoteImage(t, res.Ref))
			hasMarker := false
			for _, l := range got {
				hasMarker = hasMarker || l == marker
			}
			onPinned := len(got) == len(pinnedLayers)+1 && got[0] == pinnedLayers[0] && !hasMarker
			if onPinned != tc.pinned {
				t.Errorf("FROM %s: layers %v; pinned base %v, marker %s; built on the pinned base: %v, want %v",
					tc.from, got, pinnedLayers, marker, onPinned, tc.pinned)
			}
		})
	}
}

func TestBuildFailures(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	bk := newBuildKit(t, testenv.Buildkitd(t, host))
	base := testenv.Busybox(t, host)
	bases := []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}

	for _, tc := range []struct {
		name       string
		dockerfile string
		want       []string
	}{
		{"RUN fails", "FROM runtime\nRUN echo \"it $(echo broke)\" >&2; exit 3\n", []string{"exit code: 3", "it broke"}},
		{"parse error", "FROM runtime\nFROB the thing\n", []string{"Dockerfile:2", "unknown instruction"}},
		{"file missing from the context", "FROM runtime\nCOPY missing.txt /\n", []string{"Dockerfile:2", "missing.txt"}},
		{"base not in the registry", "FROM " + host + "/nothing@sha256:" + strings.Repeat("0", 64) + "\n", []string{"not found"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := buildContext(t, map[string]string{"Dockerfile": tc.dockerfile})
			var out lines
			_, err := bk.Build(ctx, BuildRequest{ContextDir: dir, Ask: mesh.Ask{Image: host + "/broken", Bases: bases}, Tag: "x", Log: out.add})
			if !errors.Is(err, ErrBuild) {
				t.Fatalf("Build = %v, want ErrBuild\n%s", err, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			t.Logf("%v", err)
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is more than one line", err)
			}
		})
	}
}

// A Dockerfile with a syntax directive is built with the daemon's own
// Dockerfile frontend (here a heredoc, which it knows), and its log says
// the directive's frontend was not used; with FollowSyntax the frontend
// image the directive names is run (here one the registry does not hold:
// the build fails on it).
func TestASyntaxDirectiveIsBuiltWithTheDaemonsFrontend(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	addr := testenv.Buildkitd(t, host)
	base := testenv.Busybox(t, host)
	bases := []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}
	frontend := host + "/no-such-frontend:1"
	dir := buildContext(t, map[string]string{
		"Dockerfile": "# syntax=" + frontend + "\nFROM runtime\nRUN <<EOT\necho from-a-heredoc > /h.txt\ncat /h.txt\nEOT\n",
	})
	req := BuildRequest{ContextDir: dir, Ask: mesh.Ask{Image: host + "/syntax", Bases: bases}}

	var out lines
	req.Log = out.add
	res, err := newBuildKit(t, addr).Build(ctx, req)
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, out.String())
	}
	if log := out.String(); !strings.Contains(log, "syntax: the directive's frontend "+frontend+" is not used") || !strings.Contains(log, "from-a-heredoc") {
		t.Errorf("the log does not say the directive was not followed, or lacks the heredoc's output:\n%s", log)
	}
	if res.Digest == "" {
		t.Errorf("result %+v: no digest", res)
	}

	follow, err := NewBuildKit(addr, BuildKitOptions{FollowSyntax: true})
	if err != nil {
		t.Fatal(err)
	}
	defer follow.Close()
	var fout lines
	req.Log = fout.add
	if _, err := follow.Build(ctx, req); err == nil || !strings.Contains(err.Error(), "no-such-frontend") {
		t.Errorf("Build with FollowSyntax = %v, want the failure to run %s\n%s", err, frontend, fout.String())
	} else {
		t.Logf("followed: %v", err)
	}
	if strings.Contains(fout.String(), "syntax: ") {
		t.Errorf("a followed directive is noted as not followed:\n%s", fout.String())
	}
}

// A registry that cannot be reached is infrastructure; one that refuses the
// push, the push's failure.
func TestBuildPushFailures(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)

	// A registry that answers but forbids uploads.
	inner := registry.New(t.TempDir())
	deny := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(`{"errors":[{"code":"DENIED","message":"pushes are not allowed here"}]}`))
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(deny.Close)
	denyHost := strings.TrimPrefix(deny.URL, "http://")
	// A registry that is down behind its load balancer.
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
	}))
	t.Cleanup(down.Close)
	downHost := strings.TrimPrefix(down.URL, "http://")
	closed := testenv.ClosedAddr(t)

	bk := newBuildKit(t, testenv.Buildkitd(t, host, denyHost, downHost, closed))
	base := testenv.Busybox(t, host)
	bases := []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}
	dir := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nRUN echo hi > /hi\n"})
	unseen, _ := pushMarked(t, remoteImage(t, base), host+"/other:latest")

	// A Dockerfile that fetches a URL of a host that does not answer,
	// no registry of the ask's.
	fetches := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nADD http://" + closed + "/file /file\n"})

	for _, tc := range []struct {
		name  string
		image string
		bases []mesh.Base
		want  error
		dir   string
		// says is what the message begins with.
		says string
	}{
		{"registry unreachable", closed + "/app", bases, ErrInfra, dir, "registry unreachable: "},
		{"push refused", denyHost + "/app", bases, ErrPush, dir, ""},
		{"registry answers 503", downHost + "/app", bases, ErrInfra, dir, ""},
		// A base this daemon has not seen (a digest it has, it need not fetch).
		{"base registry unreachable", host + "/app", []mesh.Base{{Module: "runtime", Image: closed + "/other", Digest: unseen}}, ErrInfra, dir, "registry unreachable: "},
		{"a URL the Dockerfile fetches unreachable", host + "/app", bases, ErrInfra, fetches,
			closed + " unreachable (not a registry of the ask's, " + host + ": a URL, an image or a git context the Dockerfile fetches itself): "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out lines
			start := time.Now()
			_, err := bk.Build(ctx, BuildRequest{ContextDir: tc.dir, Ask: mesh.Ask{Image: tc.image, Bases: tc.bases}, Tag: "x", Log: out.add})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Build = %v, want %v\n%s", err, tc.want, out.String())
			}
			var e *Error
			if tc.says != "" && (!errors.As(err, &e) || !strings.HasPrefix(e.Msg, tc.says)) {
				t.Errorf("message %q, want it to begin %q", err, tc.says)
			}
			t.Logf("%s after %s", err, time.Since(start).Round(time.Millisecond))
		})
	}
}

// Cache exported to the registry by one daemon is imported by another that
// has never built the image.
func TestBuildRegistryCache(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	base := testenv.Busybox(t, host)
	dir := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nRUN echo expensive > /out\n"})
	req := BuildRequest{
		ContextDir: dir, Tag: "c1",
		Ask: mesh.Ask{Image: host + "/cached", Cache: host + "/cache:cached",
			Bases: []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}},
	}
	first, err := newBuildKit(t, testenv.Buildkitd(t, host)).Build(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.CacheHits != 0 {
		t.Errorf("first build: %d cache hits", first.CacheHits)
	}
	// The first build ran its RUN: its steps are timed, inside the solve
	// and beside the export.
	if steps := first.Spans.Took(SpanSteps); steps <= 0 || steps+first.Spans.Took(SpanExport) > first.Spans.Took(SpanSolve) {
		t.Errorf("first build: steps %s, want more than none and with the export within the solve: %s", steps, first.Spans)
	}
	var out lines
	req.Log = out.add
	second, err := newBuildKit(t, testenv.Buildkitd(t, host)).Build(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if second.CacheHits == 0 || second.Digest != first.Digest {
		t.Errorf("second daemon: %d cache hits, digest %s (first %s)\n%s", second.CacheHits, second.Digest, first.Digest, out.String())
	}
	// Where the time went: the solve, with the cache's import and export
	// and the image's export inside it, and the verification after.
	for _, span := range []string{SpanPing, SpanSolve, SpanCacheImport, SpanExport, SpanCacheExport, SpanVerify} {
		if second.Spans.Took(span) <= 0 {
			t.Errorf("the build reports no %s span: %s", span, second.Spans)
		}
	}
	if inner := second.Spans.Took(SpanCacheImport) + second.Spans.Took(SpanSteps) + second.Spans.Took(SpanExport) + second.Spans.Took(SpanCacheExport); inner > second.Spans.Took(SpanSolve) {
		t.Errorf("the solve's parts (%s) take longer than the solve: %s", inner, second.Spans)
	}
}

// The steps span is the Dockerfile's own steps, of any stage, from the
// first's start to the last's completion: not the named contexts, the
// internal loads or the export.
func TestSolveSpansTimeTheOwnSteps(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	at := func(ms int) *time.Time { x := t0.Add(time.Duration(ms) * time.Millisecond); return &x }
	p := newProgress(nil, 100)
	p.update(&client.SolveStatus{Vertexes: []*client.Vertex{
		{Digest: "sha256:1", Name: "[internal] load build definition from Dockerfile", Started: at(0), Completed: at(5)},
		{Digest: "sha256:2", Name: "[context base] 127.0.0.1:5000/base@sha256:ab", Started: at(10), Completed: at(400)},
		{Digest: "sha256:3", Name: "[build 1/2] COPY a /a", Started: at(100), Completed: at(120)},
		{Digest: "sha256:4", Name: "[stage-1 2/2] RUN sleep 1", Started: at(130), Completed: at(350)},
		{Digest: "sha256:5", Name: "exporting to image", Started: at(360), Completed: at(500)},
	}})
	s := p.solveSpans()
	if got := s.Took(SpanSteps); got != 250*time.Millisecond {
		t.Errorf("steps %s, want 250ms (100ms to 350ms): %s", got, s)
	}
	if got := s.Took(SpanExport); got != 140*time.Millisecond {
		t.Errorf("export %s, want 140ms: %s", got, s)
	}
}

func TestSpansString(t *testing.T) {
	s := Spans{{SpanCheckout, 4 * time.Millisecond}, {SpanPing, time.Millisecond}, {SpanSolve, 120 * time.Millisecond},
		{SpanCacheImport, 12 * time.Millisecond}, {SpanSteps, 50 * time.Millisecond}, {SpanExport, 40 * time.Millisecond}, {SpanVerify, 6 * time.Millisecond}}
	want := "checkout 4ms, ping 1ms, solve 120ms (cache-import 12ms, steps 50ms, export 40ms), verify 6ms"
	if got := s.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := s.Took(SpanExport); got != 40*time.Millisecond {
		t.Errorf("Took(export) = %s", got)
	}
}

// The Dockerfile is looked for before the daemon is asked.
func TestBuildMissingDockerfile(t *testing.T) {
	bk := newBuildKit(t, "unix:///nonexistent/buildkitd.sock")
	dir := buildContext(t, map[string]string{"Containerfile": "FROM x\n"})
	for _, df := range []string{"", "Dockerfile", "sub/Dockerfile", "../Containerfile"} {
		_, err := bk.Build(context.Background(), BuildRequest{ContextDir: dir, Ask: mesh.Ask{Source: mesh.Source{Dockerfile: df}, Image: "127.0.0.1:1/x"}})
		if !errors.Is(err, ErrSource) {
			t.Errorf("Dockerfile %q: %v, want ErrSource", df, err)
		}
	}
}

// A daemon that is not there, or accepts and never answers, is an
// infrastructure failure within the dial timeout, not a hang.
func TestBuildDeadDaemon(t *testing.T) {
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mute.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	dir := buildContext(t, map[string]string{"Dockerfile": "FROM scratch\n"})
	for _, addr := range []string{
		"unix://" + filepath.Join(t.TempDir(), "buildkitd.sock"),
		"tcp://" + testenv.ClosedAddr(t),
		"tcp://" + mute.Addr().String(),
	} {
		t.Run(addr, func(t *testing.T) {
			bk, err := NewBuildKit(addr, BuildKitOptions{DialTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer bk.Close()
			start := time.Now()
			_, err = bk.Build(context.Background(), BuildRequest{ContextDir: dir, Ask: mesh.Ask{Image: "127.0.0.1:1/x"}})
			took := time.Since(start)
			if !errors.Is(err, ErrInfra) || Classify(err) != mesh.ReasonInfra {
				t.Errorf("Build = %v, want ErrInfra", err)
			}
			if took > 5*time.Second {
				t.Errorf("took %s", took)
			}
		})
	}
}

func TestBuildKitOptions(t *testing.T) {
	if _, err := NewBuildKit("unix:///x.sock", BuildKitOptions{KeepAlive: time.Minute}); err == nil {
		t.Error("a keepalive buildkitd refuses: no error")
	}
	if _, err := NewBuildKit("", BuildKitOptions{}); err == nil {
		t.Error("no address: no error")
	}
}

func TestContextNames(t *testing.T) {
	for _, tc := range []struct {
		base mesh.Base
		want string
	}{
		{mesh.Base{Module: "runtime", Image: "127.0.0.1:5000/runtime"}, "runtime 127.0.0.1:5000/runtime"},
		{mesh.Base{Module: "runtime", Image: "127.0.0.1:5000/tools/runtime"}, "runtime 127.0.0.1:5000/tools/runtime"},
		{mesh.Base{Module: "alpine", Image: "docker.io/library/alpine"}, "alpine"},
		{mesh.Base{Module: "base", Image: "registry.example/base"}, "base registry.example/base"},
	} {
		tc.base.Digest = "sha256:" + strings.Repeat("a", 64)
		got, err := contextNames(tc.base)
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("contextNames(%+v) = %q, %v; want %q", tc.base, got, err, tc.want)
		}
	}
	for _, b := range []mesh.Base{
		{Module: "x", Image: "Not/Valid", Digest: "sha256:" + strings.Repeat("a", 64)},
		{Module: "x", Image: "reg/x:tagged", Digest: "sha256:" + strings.Repeat("a", 64)},
		{Module: "x", Image: "reg/x", Digest: "sha256:short"},
	} {
		if _, err := contextNames(b); Classify(err) != mesh.ReasonAsk {
			t.Errorf("contextNames(%+v) = %v, want a malformed ask", b, err)
		}
	}
}

func TestProgress(t *testing.T) {
	var out lines
	p := newProgress(out.add, 100)
	now := time.Now()
	later := now.Add(1500 * time.Millisecond)
	p.update(&client.SolveStatus{
		Vertexes: []*client.Vertex{
			{Digest: "sha256:a", Name: "[internal] load build definition from Dockerfile", Started: &now, Completed: &later},
			{Digest: "sha256:b", Name: "[1/2] FROM docker.io/library/x", Started: &now, Completed: &later, Cached: true},
			{Digest: "sha256:c", Name: "[stage-1 2/2] RUN make", Started: &now},
		},
		Logs: []*client.VertexLog{{Vertex: "sha256:c", Data: []byte("line one\nline tw")}},
	})
	p.update(&client.SolveStatus{
		Vertexes: []*client.Vertex{{Digest: "sha256:c", Name: "[stage-1 2/2] RUN make", Started: &now, Completed: &later, Error: "exit code: 2"}},
		Logs:     []*client.VertexLog{{Vertex: "sha256:c", Data: []byte("o\n" + strings.Repeat("y", 300))}},
	})
	p.flush()
	steps, hits := p.counts()
	if steps != 2 || hits != 1 {
		t.Errorf("counts = %d steps, %d hits; want 2, 1", steps, hits)
	}
	want := []string{
		"#1 [internal] load build definition from Dockerfile", "#1 DONE 1.5s",
		"#2 [1/2] FROM docker.io/library/x", "#2 CACHED",
		"#3 [stage-1 2/2] RUN make", "#3 line one",
		"#3 ERROR: exit code: 2", "#3 line two",
	}
	if got := strings.Join(out.l[:len(want)], "\n"); got != strings.Join(want, "\n") {
		t.Errorf("log:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	if last := out.l[len(out.l)-1]; len(last) > 100+len("…") {
		t.Errorf("an unending line passed the bound: %d bytes", len(last))
	}
	if !p.failedIn(func(n string) bool { return strings.Contains(n, "RUN make") }) || !strings.HasPrefix(p.failedOutput(), strings.Repeat("y", 100)) || len(p.failedOutput()) > 100+len("…") {
		t.Errorf("failed vertex: %+v", p.failed)
	}
}

func writeTar(t *testing.T, buf *bytes.Buffer, name, content string) {
	t.Helper()
	tw := tar.NewWriter(buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(content)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestBuildMalformedRequest(t *testing.T) {
	bk := newBuildKit(t, "unix:///nonexistent/buildkitd.sock")
	dir := buildContext(t, map[string]string{"Dockerfile": "FROM x\n"})
	for _, req := range []BuildRequest{
		{ContextDir: dir},
		{ContextDir: dir, Ask: mesh.Ask{Image: "127.0.0.1:5000/app:tagged"}},
		{ContextDir: dir, Ask: mesh.Ask{Image: "127.0.0.1:5000/App"}},
		{ContextDir: dir, Ask: mesh.Ask{Image: "127.0.0.1:5000/app"}, Tag: "two words"},
	} {
		_, err := bk.Build(context.Background(), req)
		if Classify(err) != mesh.ReasonAsk {
			t.Errorf("Build(image %q, tag %q) = %v, want a malformed ask", req.Image, req.Tag, err)
		}
	}
}

// A cancelled build stops at once and says it was cancelled.
func TestBuildCancelled(t *testing.T) {
	testenv.RequireBuildkit(t)
	host := registrytest.Registry(t)
	bk := newBuildKit(t, testenv.Buildkitd(t, host))
	base := testenv.Busybox(t, host)
	dir := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nRUN echo sleeping; sleep 60\n"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		_, err := bk.Build(ctx, BuildRequest{
			ContextDir: dir, Tag: "x",
			Ask: mesh.Ask{Image: host + "/slow", Bases: []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}},
			Log: func(l string) {
				if strings.HasSuffix(l, " sleeping") {
					once.Do(func() { close(started) })
				}
			},
		})
		errc <- err
	}()
	select {
	case <-started:
	case err := <-errc:
		t.Fatalf("Build returned before the RUN step: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the RUN step did not start in 30s")
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) || Classify(err) != mesh.ReasonCancel {
			t.Errorf("Build = %v, want cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Build did not return within 10s of cancel")
	}
}

// A daemon that dies mid-build is an infrastructure failure.
func TestBuildDaemonDies(t *testing.T) {
	testenv.RequireBuildkit(t)
	host := registrytest.Registry(t)
	daemon := testenv.StartBuildkitd(t, buildkitd.Options{RegistryHosts: []string{host}, StopTimeout: 2 * time.Second})
	bk := newBuildKit(t, daemon.Addr())
	base := testenv.Busybox(t, host)
	dir := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nRUN echo sleeping; sleep 60\n"})
	var once sync.Once
	start := time.Now()
	_, err := bk.Build(context.Background(), BuildRequest{
		ContextDir: dir, Tag: "x",
		Ask: mesh.Ask{Image: host + "/slow", Bases: []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}},
		Log: func(l string) {
			if strings.HasSuffix(l, " sleeping") {
				once.Do(func() { go daemon.Stop() })
			}
		},
	})
	if !errors.Is(err, ErrInfra) {
		t.Errorf("Build = %v, want ErrInfra", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("took %s", took)
	}
}

// Solves stay out of buildkitd's build history unless History asks for it.
func TestSolvesAreRecordedInHistoryOnlyWhenAsked(t *testing.T) {
	dir := buildContext(t, map[string]string{"Dockerfile": "FROM scratch\n"})
	for _, history := range []bool{false, true} {
		b, err := NewBuildKit("unix:///nonexistent/buildkitd.sock", BuildKitOptions{History: history})
		if err != nil {
			t.Fatal(err)
		}
		opt, err := b.solveOpt(BuildRequest{ContextDir: dir, Ask: mesh.Ask{Image: "127.0.0.1:5000/app"}})
		b.Close()
		if err != nil {
			t.Fatal(err)
		}
		if opt.Internal == history {
			t.Errorf("History %t: the solve's Internal is %t, want %t", history, opt.Internal, !history)
		}
	}
}

// A RUN that mounts a build secret is built with the mount empty (the farm
// has no client to supply one) and the log says so at its line; one whose
// secret is required fails, and its log says why before the failure; the
// same for an SSH agent's mount.
func TestASecretMountIsEmptyOnTheFarmAndTheLogSaysSo(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	bk := newBuildKit(t, testenv.Buildkitd(t, host))
	base := testenv.Busybox(t, host)
	bases := []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}

	optional := buildContext(t, map[string]string{
		"Dockerfile": "FROM runtime\nRUN --mount=type=secret,id=token test ! -e /run/secrets/token && echo no-token-here\n",
	})
	var out lines
	if _, err := bk.Build(ctx, BuildRequest{ContextDir: optional, Ask: mesh.Ask{Image: host + "/secret", Bases: bases}, Log: out.add}); err != nil {
		t.Fatalf("Build with an optional secret: %v\n%s", err, out.String())
	}
	if log := out.String(); !strings.Contains(log, "secret: Dockerfile:2: RUN --mount=type=secret,id=token: a build on the farm has no client to supply build secrets: the step sees no /run/secrets/token") || !strings.Contains(log, "no-token-here") {
		t.Errorf("the log does not say the secret is not supplied, or the step saw one:\n%s", log)
	}

	required := buildContext(t, map[string]string{
		"Dockerfile": "FROM runtime\nRUN echo before\nRUN --mount=type=secret,id=token,required=true cat /run/secrets/token\n",
	})
	var rout lines
	_, err := bk.Build(ctx, BuildRequest{ContextDir: required, Ask: mesh.Ask{Image: host + "/secret", Bases: bases}, Log: rout.add})
	if !errors.Is(err, ErrBuild) {
		t.Fatalf("Build with a required secret = %v, want a build failure\n%s", err, rout.String())
	}
	if log := rout.String(); !strings.Contains(log, "secret: Dockerfile:3: RUN --mount=type=secret,id=token: a build on the farm has no client to supply build secrets: the step fails (required=true)") {
		t.Errorf("the log does not say why the required secret is missing:\n%s", log)
	}
	t.Logf("required: %v", err)

	ssh := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nRUN --mount=type=ssh echo no-agent-here\nRUN --mount=type=ssh,required=true true\n"})
	var sout lines
	_, err = bk.Build(ctx, BuildRequest{ContextDir: ssh, Ask: mesh.Ask{Image: host + "/secret", Bases: bases}, Log: sout.add})
	if !errors.Is(err, ErrBuild) {
		t.Fatalf("Build with a required SSH mount = %v, want a build failure\n%s", err, sout.String())
	}
	if log := sout.String(); !strings.Contains(log, "ssh: Dockerfile:2: RUN --mount=type=ssh: a build on the farm has no client to forward an SSH agent: the step gets no SSH agent") ||
		!strings.Contains(log, "ssh: Dockerfile:3: RUN --mount=type=ssh: a build on the farm has no client to forward an SSH agent: the step fails (required=true)") {
		t.Errorf("the log does not say what the SSH mounts get:\n%s", log)
	}
	t.Logf("ssh: %v", err)
}

// A base's ONBUILD triggers run in the build of a module on it, though the
// base is supplied as a named context pinned to its digest: the module's
// image holds what they copied and ran, and a failing trigger fails the
// module's build as a build error.
func TestOnbuildOfABaseRunsInTheModuleOnIt(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	bk := newBuildKit(t, testenv.Buildkitd(t, host))
	busybox := testenv.Busybox(t, host)
	build := func(dir, image string, bases ...mesh.Base) (Result, string, error) {
		var out lines
		res, err := bk.Build(ctx, BuildRequest{ContextDir: dir, Log: out.add,
			Ask: mesh.Ask{Platform: "linux/amd64", Image: host + "/" + image, Bases: bases}})
		return res, out.String(), err
	}

	sdk, log, err := build(buildContext(t, map[string]string{
		"Dockerfile": "FROM runtime\nONBUILD COPY app.txt /srv/app.txt\nONBUILD RUN cat /srv/app.txt > /srv/seen-by-onbuild\n",
	}), "sdk", mesh.Base{Module: "runtime", Image: host + "/busybox", Digest: digestOf(busybox)})
	if err != nil {
		t.Fatalf("the base with ONBUILD triggers: %v\n%s", err, log)
	}
	onSDK := mesh.Base{Module: "sdk", Image: host + "/sdk", Digest: sdk.Digest}
	app, log, err := build(buildContext(t, map[string]string{"Dockerfile": "FROM sdk\n", "app.txt": "from the module's context\n"}), "app", onSDK)
	if err != nil {
		t.Fatalf("the module on it: %v\n%s", err, log)
	}
	// Triggers do not pass on a second level: what the module's image
	// holds is what its own build's triggers left.
	_, log, err = build(buildContext(t, map[string]string{
		"Dockerfile": "FROM app\nRUN test \"$(cat /srv/seen-by-onbuild)\" = 'from the module'\"'\"'s context'\n",
	}), "check", mesh.Base{Module: "app", Image: host + "/app", Digest: app.Digest})
	if err != nil {
		t.Fatalf("the module's image does not hold what its base's ONBUILD triggers copied and ran: %v\n%s", err, log)
	}

	// A module whose context lacks what a trigger copies fails as a build
	// of its own, not as a malformed ask or the infrastructure.
	_, log, err = build(buildContext(t, map[string]string{"Dockerfile": "FROM sdk\n"}), "broken", onSDK)
	if !errors.Is(err, ErrBuild) || !strings.Contains(err.Error(), "app.txt") {
		t.Fatalf("a trigger's COPY of a file the context lacks: %v, want a build error naming the file\n%s", err, log)
	}
	t.Logf("a trigger's COPY of a missing file: %v", err)
}
