package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// Worker does the work of one ask: check the source out, build, push, verify.
// Its errors wrap ErrSource, ErrBuild, ErrPush or ErrInfra (see Classify).
type Worker interface {
	Work(ctx context.Context, ask mesh.Ask, log func(line string)) (Result, error)
}

// Result is a pushed image: what BuildKit.Build returns, what a Worker
// returns, and what the agent announces as built (with the ask it answers,
// in one place: builtEvent).
type Result struct {
	Digest string // sha256:… of the pushed manifest
	Ref    string // repository@digest
	// Commit is the full hash built; empty means the ask's commit.
	Commit string
	// Bytes is the size of the image in the registry: manifest, config and
	// layers.
	Bytes int64
	// Steps counts the Dockerfile's steps (FROM, RUN, COPY, … of every stage
	// built), CacheHits those answered from cache.
	Steps, CacheHits int
	// Duration is how long the builder took (solve, push, verify). The
	// built event's duration is the agent's whole work on the ask,
	// checkout included.
	Duration time.Duration
	// Attestations are the provenance and SBOM pushed with the image, if
	// any (attest.go).
	Attestations *mesh.Attestations
	// Spans are where the work's time went, in order (spans.go).
	Spans Spans
}

// Builder is the part of BuildKit a BuildWorker calls.
type Builder interface {
	Build(ctx context.Context, req BuildRequest) (Result, error)
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
	// Registry is the mesh's registry (host:port), which the machine's
	// probe asks whether it answers (see Probe). Empty: the registry of
	// the last ask's image, once there was one.
	Registry string
	// Modules, when set, says whether a name is a module the catalogue
	// builds (BuildRequest.Modules).
	Modules func(module string) bool

	lastRegistry lastRegistry
}

// Work implements Worker.
func (w *BuildWorker) Work(ctx context.Context, ask mesh.Ask, log func(string)) (Result, error) {
	w.lastRegistry.saw(ask.Image)
	log("checking out " + ask.Source.Repo + " at " + ask.Source.Commit)
	t := time.Now()
	dir, commit, err := w.Sources.CheckoutCommit(ctx, ask.Source)
	if err != nil {
		return Result{}, err
	}
	defer w.Sources.Release(dir)
	for _, sub := range w.Sources.Submodules(dir) {
		if sub.URL == "" {
			log("source: " + sub.Path + " in the build context is a git submodule that .gitmodules gives no url for, which is not fetched: its directory is empty in this build")
			continue
		}
		log("source: submodule " + sub.Path + ": " + sub.URL + " at " + short(sub.Commit))
	}
	if lfs := w.Sources.LFSPointers(dir); len(lfs) > 0 {
		log("source: " + lfsNote(lfs))
	}
	dfDir, err := w.Sources.DockerfileDir(ctx, ask.Source, commit)
	if err != nil {
		return Result{}, err
	}
	if dfDir != "" {
		defer w.Sources.Release(dfDir)
	}
	checkout := time.Since(t)
	tag := w.Tag
	if tag == "" {
		tag = "latest"
	}
	if commit != "" {
		ask.Source.Commit = commit // the provenance names the commit built
	}
	res, err := w.Builder.Build(ctx, BuildRequest{Ask: ask, ContextDir: dir, DockerfileDir: dfDir, Tag: tag, Log: log, Modules: w.Modules})
	if err != nil {
		return Result{}, err
	}
	res.Commit = commit
	res.Spans = append(Spans{{Name: SpanCheckout, Took: checkout}}, res.Spans...)
	log("took: " + res.Spans.String())
	return res, nil
}

// lfsNote says which files of a build context are Git LFS pointers (the
// first few of them, and how many in all).
func lfsNote(files []string) string {
	const named = 5
	list := strings.Join(files[:min(len(files), named)], ", ")
	if len(files) > named {
		list += fmt.Sprintf(" and %d more", len(files)-named)
	}
	what := "1 file in the build context is a Git LFS pointer"
	if len(files) > 1 {
		what = fmt.Sprintf("%d files in the build context are Git LFS pointers", len(files))
	}
	return what + " (" + list + "): the objects they name are not fetched, as docker build of a git context does not fetch them, so the build sees the pointers' text"
}
