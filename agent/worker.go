package agent

import (
	"context"

	"github.com/meshbuild/meshbuild/mesh"
)

// Builder is the part of BuildKit a BuildWorker calls.
type Builder interface {
	Build(ctx context.Context, req BuildRequest) (BuildResult, error)
}

// BuildWorker does an ask the way every machine does: check the commit out
// into the workspace, build it through BuildKit with every base pinned to the
// ask's digest, push by digest and verify the digest resolves.
type BuildWorker struct {
	Sources *Sources
	Builder Builder
	// Tag is pushed with the digest; "latest" by default. The digest, not
	// the tag, is what the mesh builds on.
	Tag string
}

// Work implements Worker.
func (w *BuildWorker) Work(ctx context.Context, ask mesh.Ask, log func(string)) (Result, error) {
	log("checking out " + ask.Source.Repo + " at " + ask.Source.Commit)
	dir, commit, err := w.Sources.CheckoutCommit(ctx, ask.Source)
	if err != nil {
		return Result{}, err
	}
	defer w.Sources.Release(dir)
	tag := w.Tag
	if tag == "" {
		tag = "latest"
	}
	res, err := w.Builder.Build(ctx, BuildRequest{
		ContextDir: dir, Dockerfile: ask.Source.Dockerfile, Platform: ask.Platform,
		Image: ask.Image, Tag: tag, Bases: ask.Bases, Cache: ask.Cache,
		Log: log,
	})
	if err != nil {
		return Result{}, err
	}
	return Result{Digest: res.Digest, Ref: res.Ref, Commit: commit, Bytes: res.Bytes, CacheHits: res.CacheHits, Steps: res.Steps}, nil
}
