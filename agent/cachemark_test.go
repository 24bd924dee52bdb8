package agent

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// A build exports its registry cache once per input key: a build of a key
// whose cache the registry holds (on another daemon) does not export it
// again; after another key's build has exported over it, it does; an ask
// without a key always does.
func TestBuildCacheExportedOncePerKey(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	base := testenv.Busybox(t, host)
	bases := []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}}
	one := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nRUN echo one > /out\n"})
	two := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nRUN echo two > /out\n"})
	reqOf := func(dir, key string) BuildRequest {
		return BuildRequest{ContextDir: dir, Tag: "latest",
			Ask: mesh.Ask{Image: host + "/keyed", Cache: host + "/keyed:buildcache", Key: key, Bases: bases}}
	}
	a, b := newBuildKit(t, testenv.Buildkitd(t, host)), newBuildKit(t, testenv.Buildkitd(t, host))
	build := func(bk *BuildKit, req BuildRequest, wantExport bool) Result {
		t.Helper()
		var out lines
		req.Log = out.add
		res, err := bk.Build(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		exported := res.Spans.Took(SpanCacheExport) > 0
		said := strings.Contains(out.String(), "not exported again")
		if exported != wantExport || said == wantExport {
			t.Errorf("build of key %q: cache exported %t (the log says it was not: %t); want exported %t\n%s", req.Key, exported, said, wantExport, out.String())
		}
		return res
	}
	held := func(req BuildRequest) (held, absent bool) {
		t.Helper()
		mark, ok := a.cacheMarkOf(ctx, req)
		if !ok || mark.note != host+"/keyed:buildcache-mark" || len(mark.key) != 64 {
			t.Fatalf("cacheMarkOf = %+v, %t", mark, ok)
		}
		held, absent, _ = a.cacheHeld(ctx, req, mark)
		return held, absent
	}

	if h, absent := held(reqOf(one, "k1")); h || !absent {
		t.Fatalf("before any build: held %t, absent %t; want no cache at all", h, absent)
	}
	// The first build imports nothing (there is nothing: BuildKit would
	// print its not found as an ERROR) and exports the first cache.
	var firstLog lines
	firstReq := reqOf(one, "k1")
	firstReq.Log = firstLog.add
	first, err := a.Build(ctx, firstReq)
	if err != nil {
		t.Fatal(err)
	}
	if l := firstLog.String(); strings.Contains(l, "importing cache manifest") || strings.Contains(l, "ERROR") || first.Spans.Took(SpanCacheExport) == 0 {
		t.Errorf("the first build of a cache that is not there: want no import, no ERROR, an export\n%s", l)
	}
	if h, absent := held(reqOf(one, "k1")); !h || absent {
		t.Fatalf("after k1's build: held %t, absent %t; want its cache marked as k1's", h, absent)
	}
	// Another daemon, the same key: every step from the imported cache,
	// nothing to export.
	again := build(b, reqOf(one, "k1"), false)
	if again.Digest != first.Digest || again.CacheHits == 0 {
		t.Errorf("k1 again: digest %s (first %s), %d of %d steps cached", again.Digest, first.Digest, again.CacheHits, again.Steps)
	}
	// Another key's build exports over it; k1 then exports again.
	build(b, reqOf(two, "k2"), true)
	if h, _ := held(reqOf(one, "k1")); h {
		t.Error("k1's cache still marked held after k2's build exported over it")
	}
	// The same image built again on a: its size is the one read the
	// first time (not read again), and the one b read.
	if last := build(a, reqOf(one, "k1"), true); last.Digest != first.Digest || last.Bytes != first.Bytes || again.Bytes != first.Bytes || first.Bytes <= 0 {
		t.Errorf("k1 on a again: %s of %d bytes; first %s of %d bytes, on b %d bytes", last.Digest, last.Bytes, first.Digest, first.Bytes, again.Bytes)
	}
	// The SOURCE_DATE_EPOCH and the daemon's version are part of the
	// mark: another epoch (the RUN steps see it) or another BuildKit is
	// another cache.
	m0, _ := cacheMarkFor(reqOf(one, "k1"), 0, "v1")
	for _, other := range []struct {
		epoch  int64
		daemon string
	}{{1, "v1"}, {0, "v2"}} {
		if m, _ := cacheMarkFor(reqOf(one, "k1"), other.epoch, other.daemon); m.note != m0.note || m.key == m0.key {
			t.Errorf("epoch %d, daemon %s: mark %+v; epoch 0, daemon v1: %+v; want another key in the same note", other.epoch, other.daemon, m, m0)
		}
	}
	// One note per cache, whatever the keys built: the repository's tags
	// are the image's, the cache's and the note's (and the referrers tags
	// of the images' attestations, sha256-<hex>).
	all, err := remote.List(mustRepo(t, host+"/keyed"))
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, tag := range all {
		if !strings.HasPrefix(tag, "sha256-") {
			tags = append(tags, tag)
		}
	}
	slices.Sort(tags)
	if want := []string{"buildcache", "buildcache-mark", "latest"}; !slices.Equal(tags, want) {
		t.Errorf("tags of %s/keyed = %v, want %v", host, tags, want)
	}
	// No key: always exported.
	build(a, reqOf(one, ""), true)
	build(a, reqOf(one, ""), true)
}

func mustRepo(t *testing.T, repo string) name.Repository {
	t.Helper()
	r, err := name.NewRepository(repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
