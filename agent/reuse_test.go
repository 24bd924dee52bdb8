package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// A build of an input key the registry holds the cache of, exported by a
// build of the same settings, whose every step comes from that cache, is
// answered with what that build pushed — verified, the referrer made and
// the tag moved — and not exported again: on another daemon, with its own
// attestations and its size. A build of the same key at another commit
// (its index names the revision) is exported, to the same image; a build
// whose steps run is exported; and when the registry lost what was pushed,
// it is exported again, nothing lost.
func TestAFullyCachedBuildOfAPushedInputIsNotPushedAgain(t *testing.T) {
	testenv.RequireBuildkit(t)
	ctx := context.Background()
	host := registrytest.Registry(t)
	base := testenv.Busybox(t, host)
	dir := buildContext(t, map[string]string{"Dockerfile": "FROM runtime\nRUN echo built > /out\n"})
	reqOf := func(commit string) BuildRequest {
		return BuildRequest{ContextDir: dir, Tag: "latest", Ask: mesh.Ask{
			Image: host + "/reused", Cache: host + "/reused:buildcache", Key: "k1",
			Source: mesh.Source{Repo: "https://git.example/r.git", Commit: commit},
			Bases:  []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}},
		}}
	}
	build := func(bk *BuildKit, req BuildRequest) (Result, string) {
		t.Helper()
		var out lines
		req.Log = out.add
		res, err := bk.Build(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res, out.String()
	}
	a, b := newBuildKit(t, testenv.Buildkitd(t, host)), newBuildKit(t, testenv.Buildkitd(t, host))
	first, log := build(a, reqOf("c1"))
	if first.Spans.Took(SpanExport) == 0 || first.Attestations == nil || strings.Contains(log, "not pushed again") {
		t.Fatalf("the first build: export %s, attestations %+v\n%s", first.Spans.Took(SpanExport), first.Attestations, log)
	}

	again, log := build(b, reqOf("c1"))
	switch {
	case !strings.Contains(log, "not pushed again") || again.Spans.Took(SpanExport) != 0:
		t.Errorf("the same key, commit and settings on another daemon: exported (%s)\n%s", again.Spans.Took(SpanExport), log)
	case again.Digest != first.Digest || again.Bytes != first.Bytes || again.CacheHits == 0:
		t.Errorf("reused: %s of %d bytes, %d cache hits; want %s of %d bytes", again.Digest, again.Bytes, again.CacheHits, first.Digest, first.Bytes)
	case again.Attestations == nil || *again.Attestations != *first.Attestations:
		t.Errorf("reused attestations %+v, want the first build's %+v", again.Attestations, first.Attestations)
	}
	// The tag names what was verified.
	if tagged := remoteImage(t, host+"/reused:latest"); tagged == nil {
		t.Fatal("no tag")
	}

	// Another commit of the same tree: the same key, another revision in
	// the index: exported, the same image.
	other, log := build(b, reqOf("c2"))
	if strings.Contains(log, "not pushed again") || other.Spans.Took(SpanExport) == 0 {
		t.Errorf("another commit: not exported\n%s", log)
	}
	if other.Digest != first.Digest || other.Attestations == nil || other.Attestations.Index == first.Attestations.Index {
		t.Errorf("another commit: image %s (first %s), index %+v (first %+v): want the same image, another index", other.Digest, first.Digest, other.Attestations, first.Attestations)
	}

	// The registry lost what the first build pushed: exported again.
	lostRef, err := name.NewDigest(host+"/reused@"+first.Attestations.Index, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Delete(lostRef); err != nil {
		t.Fatal(err)
	}
	lost, log := build(b, reqOf("c1"))
	if !strings.Contains(log, "does not verify") || lost.Spans.Took(SpanExport) == 0 || lost.Spans.Took(SpanCacheExport) == 0 || lost.Digest != first.Digest {
		t.Errorf("what was pushed is gone: export %s, cache export %s, digest %s (want %s)\n%s", lost.Spans.Took(SpanExport), lost.Spans.Took(SpanCacheExport), lost.Digest, first.Digest, log)
	}
	// Its cache marked afresh with what it pushed: the next one is
	// answered with that.
	after, log := build(a, reqOf("c1"))
	if !strings.Contains(log, "not pushed again") || lost.Attestations == nil || after.Attestations == nil || *after.Attestations != *lost.Attestations {
		t.Errorf("after the lost push was pushed again: attestations %+v, want %+v\n%s", after.Attestations, lost.Attestations, log)
	}
}
