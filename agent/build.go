package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/distribution/reference"
	dockerconfig "github.com/docker/cli/cli/config"
	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	gatewaypb "github.com/moby/buildkit/frontend/gateway/pb"
	"github.com/moby/buildkit/session"
	"github.com/moby/buildkit/session/auth/authprovider"
	"github.com/moby/buildkit/solver/errdefs"
	"github.com/moby/buildkit/util/grpcerrors"
	digest "github.com/opencontainers/go-digest"
	"github.com/tonistiigi/fsutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

// BuildKitOptions configure the connection to buildkitd. The zero value
// takes every default.
type BuildKitOptions struct {
	// DialTimeout bounds reaching the daemon: a daemon that does not answer
	// within it is an infrastructure failure, not a hang. Default 10s.
	DialTimeout time.Duration
	// KeepAlive is how often an idle connection is pinged to find a daemon
	// that went away without closing it. BuildKit's gRPC server refuses
	// pings more often than every 5 minutes, so it may not be less. Default
	// 6 minutes.
	KeepAlive time.Duration
	// MaxLogLine bounds one line of build output passed to
	// the build's log; longer lines are cut. Default 4096 bytes.
	MaxLogLine int
	// Registry is the client a push is verified with (its digest resolved,
	// its size read) and a failed build's registries are pinged with; its
	// Insecure is passed to BuildKit's push and cache. nil is the default
	// client: credentials from the docker config, as BuildKit pushes with.
	Registry *registry.Client
	// SourceDateEpoch is the SOURCE_DATE_EPOCH (seconds since the Unix
	// epoch) every build is made reproducible to: BuildKit gets it as the
	// build argument (the image config's created time and its history are
	// clamped to it) and rewrites every new layer's file timestamps to it,
	// so that the same content gives the same digest wherever and whenever
	// it is built. Default 0 (1970-01-01, as ko and rules_oci use); it may
	// not be negative.
	SourceDateEpoch int64
	// Provenance is the provenance attestation pushed with every image
	// (unless its manifest says build.provenance: false): ProvenanceMax
	// (the default: BuildKit's mode=max, with the source repository,
	// commit, context path and Dockerfile, and every base by digest),
	// "min", or ProvenanceOff. The image's digest is unaffected (see
	// attest.go): only the index pushed with it differs between builds.
	Provenance string
	// SBOMGenerator is the SBOM generator image BuildKit runs to make an
	// SPDX SBOM of every image (unless its manifest says build.sbom:
	// false), e.g. <the mesh's registry>/buildkit-syft-scanner@sha256:….
	// Empty (the default) makes none, and each build's log says so: with
	// no outside registry the generator must come from the mesh's own.
	SBOMGenerator string
	// History records every build in buildkitd's build history (what
	// `buildctl debug history` and `docker buildx history` list), as
	// buildctl's builds are. Off by default: recording writes a history
	// provenance of the build (mode=max, with its resource usage) to the
	// daemon's store before the solve answers — tens of milliseconds on
	// every build, the larger part of a fully cached one — and the farm
	// keeps its own record of every build (its events and log.<ask>).
	History bool
	// FollowSyntax builds a Dockerfile whose first line is a syntax
	// directive (# syntax=docker/dockerfile:1) with the frontend image it
	// names, which buildkitd must then be able to pull. Off by default:
	// every Dockerfile is built with buildkitd's own Dockerfile frontend,
	// pinned with the daemon and needing no registry beyond the mesh's,
	// and the build's log says the directive was not followed (a farm
	// with no outside registry would otherwise retry such a build as
	// infrastructure until its --retry-for, then fail it).
	FollowSyntax bool
}

// minKeepAlive is the ping interval BuildKit's gRPC server tolerates (the
// gRPC default enforcement policy, which buildkitd does not change).
const minKeepAlive = 5 * time.Minute

func (o BuildKitOptions) withDefaults() (BuildKitOptions, error) {
	if o.DialTimeout == 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = 6 * time.Minute
	}
	if o.MaxLogLine == 0 {
		o.MaxLogLine = 4096
	}
	if o.Provenance == "" {
		o.Provenance = ProvenanceMax
	}
	if o.Registry == nil {
		// One client for every build: its connections and token
		// exchanges are reused from one verification to the next.
		o.Registry = registry.NewClient()
	}
	switch {
	case o.DialTimeout < 0:
		return o, fmt.Errorf("%w: buildkit dial timeout %s is negative", ErrConfig, o.DialTimeout)
	case o.KeepAlive < minKeepAlive:
		return o, fmt.Errorf("%w: buildkit keepalive %s: buildkitd refuses pings more often than every %s", ErrConfig, o.KeepAlive, minKeepAlive)
	case o.MaxLogLine < 80:
		return o, fmt.Errorf("%w: max log line %d: want at least 80", ErrConfig, o.MaxLogLine)
	case o.Provenance != ProvenanceMax && o.Provenance != "min" && o.Provenance != ProvenanceOff:
		return o, fmt.Errorf("%w: provenance %q: want %s, min or %s", ErrConfig, o.Provenance, ProvenanceMax, ProvenanceOff)
	case o.SBOMGenerator != "" && !validImageRef(o.SBOMGenerator):
		return o, fmt.Errorf("%w: sbom generator %q is not an image reference: name an image in the mesh's registry, such as 127.0.0.1:5000/buildkit-syft-scanner:stable-1", ErrConfig, o.SBOMGenerator)
	case o.SourceDateEpoch < 0:
		return o, fmt.Errorf("%w: source date epoch %d is negative: want seconds since 1970-01-01 (0, the default, is that day)", ErrConfig, o.SourceDateEpoch)
	}
	return o, nil
}

// BuildKit builds images with a buildkitd through BuildKit's Go client and
// its built-in dockerfile.v0 frontend, and pushes them by digest.
type BuildKit struct {
	addr string
	opts BuildKitOptions
	c    *client.Client
	// auth answers the daemon's credential requests from the docker config
	// (~/.docker/config.json), as buildctl does; with none, registries are
	// spoken to anonymously.
	auth session.Attachable
	// sizes are the sizes of the images verified before (verify.go).
	sizes imageSizes
}

// NewBuildKit returns a builder for the daemon at addr
// ("unix:///run/buildkit/buildkitd.sock", "tcp://host:1234"). It does not
// wait for the daemon: every call fails fast with ErrInfra while it cannot
// be reached.
func NewBuildKit(addr string, opts BuildKitOptions) (*BuildKit, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if addr == "" {
		return nil, fmt.Errorf("%w: buildkit address is empty", ErrConfig)
	}
	// gRPC calls fail fast by default (no wait-for-ready): a call on a
	// connection that cannot be made returns Unavailable at once. The
	// connect timeout bounds a dial that hangs (a dropped SYN); keepalive
	// finds a peer that vanished mid-build.
	c, err := client.New(context.Background(), addr,
		client.WithGRPCDialOption(grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: o.DialTimeout,
		})),
		client.WithGRPCDialOption(grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:    o.KeepAlive,
			Timeout: 30 * time.Second,
		})),
	)
	if err != nil {
		return nil, fmt.Errorf("buildkit client for %s: %w", addr, err)
	}
	auth := authprovider.NewDockerAuthProvider(authprovider.DockerAuthProviderConfig{
		ConfigFile: dockerconfig.LoadDefaultConfigFile(io.Discard),
	})
	return &BuildKit{addr: addr, opts: o, c: c, auth: auth}, nil
}

// Close closes the connection to the daemon.
func (b *BuildKit) Close() error { return b.c.Close() }

// Ping checks that the daemon answers and has a worker, within the dial
// timeout. Its error wraps ErrInfra.
func (b *BuildKit) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.opts.DialTimeout)
	defer cancel()
	ws, err := b.c.ListWorkers(ctx)
	if err == nil && len(ws) == 0 {
		err = errors.New("no workers")
	}
	if err != nil {
		return classified(ErrInfra, fmt.Sprintf("buildkitd at %s does not answer: %s", b.addr, lastLine(err.Error())), err)
	}
	return nil
}

// BuildRequest is one ask as BuildKit is asked to build it: the ask itself,
// unchanged — its target Image, its Bases, its Cache, its Platform and its
// Source's Dockerfile are what is built — and what only the machine knows:
// where the source is checked out, the tag, how to reach the registries and
// where the output goes.
//
// The ask's Image is the target repository without tag or digest
// ("127.0.0.1:5000/app"). Its Bases are supplied as named contexts pinned to
// their digests: the Dockerfile may name a base by its module name (FROM
// runtime) or by its repository, bare or tagged latest (FROM
// 127.0.0.1:5000/runtime, FROM 127.0.0.1:5000/runtime:latest). Another tag
// is not pinned. A stage named like a base module (FROM x AS runtime) is
// replaced by the base, as BuildKit does with named contexts. Its Cache is
// the registry reference build cache is imported from and exported to
// (mode=max); empty for none. A cache that cannot be exported does not fail
// the build. Its Source.Dockerfile is relative to ContextDir; default
// "Dockerfile".
type BuildRequest struct {
	mesh.Ask
	// ContextDir is the build context, as Sources.Checkout returns it.
	ContextDir string
	// DockerfileDir is the directory that holds the Dockerfile when it
	// lies outside the context (mesh.DockerfileOutside), as
	// Sources.DockerfileDir returns it; empty for one in the context.
	DockerfileDir string
	// Tag is pushed along with the digest; empty pushes by digest only.
	Tag string
	// Log receives the build's output line by line; nil discards it.
	Log func(line string)
	// Modules, when set, says whether a name is a module the catalogue
	// builds: a Dockerfile that builds on one the ask does not supply as a
	// base is refused as a source error, naming the fix (undeclaredBase).
	Modules func(module string) bool
}

// Build builds req's Dockerfile, pushes the image by digest (and under
// req.Tag), checks that the registry resolves the digest, and returns it.
// Errors wrap ErrSource (the Dockerfile is not in the context), ErrBuild
// (the Dockerfile failed), ErrPush (the registry refused the image) or
// ErrInfra (the daemon or a registry could not be reached); a cancelled
// ctx returns its error.
func (b *BuildKit) Build(ctx context.Context, req BuildRequest) (Result, error) {
	begun := time.Now()
	var spans Spans
	opt, err := b.solveOpt(req)
	if err != nil {
		return Result{}, err
	}
	t := time.Now()
	mh, err := b.pingMark(ctx, req, len(opt.CacheExports) > 0)
	if err != nil {
		return Result{}, err
	}
	cacheHeld := mh.held
	spans.add(SpanPing, time.Since(t))
	cacheExports := opt.CacheExports
	if cacheHeld {
		opt.CacheExports = nil
	}
	if mh.absent {
		opt.CacheImports = nil // nothing there yet: the build exports the first
	}

	if req.Log != nil {
		_, notes := b.attestAttrs(req)
		for _, n := range notes {
			req.Log(n)
		}
		if cacheHeld {
			req.Log("build cache: " + req.Cache + " holds this input key's cache already: not exported again")
		}
	}
	export := exportFingerprint(opt)
	if mh.reusable(opt, export) {
		if res, ok, err := b.reuse(ctx, req, opt, mh.pushed, spans, begun); err != nil || ok {
			return res, err
		}
		// A step ran, or what was pushed is gone: the registry's cache
		// did not give this build what its mark says. Exported, with its
		// cache, which is marked afresh.
		opt.CacheExports, cacheHeld = cacheExports, false
	}
	t = time.Now()
	resp, p, err := b.solve(ctx, req, opt)
	if err != nil {
		return Result{}, err
	}
	spans.add(SpanSolve, time.Since(t))
	spans = append(spans, p.solveSpans()...)
	if note := slowExportNote(spans, req.Source.Compression); note != "" && req.Log != nil {
		req.Log(note)
	}
	t = time.Now()

	dgst := resp.ExporterResponse["containerimage.digest"]
	if _, perr := digest.Parse(dgst); perr != nil {
		return Result{}, classified(ErrPush, fmt.Sprintf("buildkitd returned no image digest for %s (%q)", req.Image, dgst), perr)
	}
	// At once with the verification: the cache just exported marked as
	// this input key's.
	marked := make(chan error, 1)
	go func() {
		if !mh.marks || cacheHeld {
			marked <- nil
			return
		}
		marked <- b.markCache(ctx, mh.mark, resp.ExporterResponse, export)
	}()
	pushed, err := b.verify(ctx, req, dgst)
	merr := <-marked
	if err != nil {
		return Result{}, err
	}
	if merr != nil && req.Log != nil {
		req.Log("build cache: not marked as this input key's (the next build of it exports it again): " + lastLine(merr.Error()))
	}
	spans.add(SpanVerify, time.Since(t))
	return builtResult(req, pushed, p, spans, begun), nil
}

// builtResult is the Result of a build of req that solved with progress p
// and pushed (or found pushed) what pushed is.
func builtResult(req BuildRequest, pushed pushed, p *progress, spans Spans, begun time.Time) Result {
	steps, hits := p.counts()
	return Result{
		Digest: pushed.digest, Ref: req.Image + "@" + pushed.digest, Bytes: pushed.size,
		Steps: steps, CacheHits: hits, Duration: time.Since(begun), Attestations: pushed.att, Spans: spans,
	}
}

// markHeld is what Build knows of its input key's cache mark
// (cachemark.go): the mark, whether marks are kept, and whether the
// registry holds the cache already.
type markHeld struct {
	mark  cacheMark
	marks bool
	held  bool
	// absent: the registry has no cache at the ask's Cache at all.
	absent bool
	// pushed and export are, when held, what the build that exported the
	// cache pushed and the fingerprint of its export (empty from a note
	// that names neither).
	pushed, export string
}

// reusable reports whether a build of opt (its export's fingerprint
// export) may be answered with what the build that exported its cache
// pushed: the cache held, that build's fingerprint this one's, and the
// push by digest (a tag BuildKit would push is not moved by verify).
func (m markHeld) reusable(opt client.SolveOpt, export string) bool {
	if !m.held || m.export == "" || m.export != export || len(opt.Exports) != 1 || opt.Exports[0].Attrs["push-by-digest"] != "true" {
		return false
	}
	_, err := digest.Parse(m.pushed)
	return err == nil
}

// reuse answers a build whose input key's cache the registry holds,
// exported by a build of the same export fingerprint, without exporting
// when nothing would change: it solves opt without its exports, and when
// every one of the Dockerfile's own steps came from the cache, the image
// is the one that build pushed — the same steps' results, the same
// settings — so that is verified as if just pushed (the referrer made, the
// tag moved) and returned. ok is false, and the caller exports as before,
// when a step ran (its result may differ) or what was pushed does not
// verify (the registry lost it). A forced rebuild of an unchanged module
// is built (every step looked up) and not pushed again.
func (b *BuildKit) reuse(ctx context.Context, req BuildRequest, opt client.SolveOpt, pushedDigest string, spans Spans, begun time.Time) (res Result, ok bool, err error) {
	log := func(s string) {
		if req.Log != nil {
			req.Log(s)
		}
	}
	quiet := opt
	quiet.Exports, quiet.CacheExports = nil, nil
	t := time.Now()
	_, p, err := b.solve(ctx, req, quiet)
	if err != nil {
		return Result{}, false, err
	}
	spans.add(SpanSolve, time.Since(t))
	spans = append(spans, p.solveSpans()...)
	own, cached := p.ownSteps()
	if own == 0 || cached < own {
		log(fmt.Sprintf("export: %d of the Dockerfile's %d steps ran: solved again, to export what they made and their cache", own-cached, own))
		return Result{}, false, nil
	}
	t = time.Now()
	pushed, err := b.verify(ctx, req, pushedDigest)
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, false, context.Cause(ctx)
		}
		log("export: " + pushedDigest + ", pushed by the build that exported this input key's cache, does not verify (" + lastLine(err.Error()) + "): exported again, with the cache")
		return Result{}, false, nil
	}
	spans.add(SpanVerify, time.Since(t))
	log(fmt.Sprintf("export: every step came from the cache (%d of %d), and the registry holds what the build that exported this input key's cache pushed with the same settings, %s: verified, not pushed again", cached, own, pushedDigest))
	return builtResult(req, pushed, p, spans, begun), true, nil
}

// pingMark pings the daemon and, at once with the ping when the build
// exports its cache, looks whether the registry already holds this input
// key's build cache.
func (b *BuildKit) pingMark(ctx context.Context, req BuildRequest, exports bool) (markHeld, error) {
	held := make(chan markHeld, 1)
	if exports {
		go func() {
			var m markHeld
			if m.mark, m.marks = b.cacheMarkOf(ctx, req); m.marks {
				var note map[string]string
				m.held, m.absent, note = b.cacheHeld(ctx, req, m.mark)
				m.pushed, m.export = note[annotationCachePushed], note[annotationCacheExport]
			}
			held <- m
		}()
	} else {
		held <- markHeld{}
	}
	if err := b.Ping(ctx); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return markHeld{}, context.Cause(ctx)
		}
		return markHeld{}, err
	}
	return <-held, nil
}

// solve runs opt on the daemon, its progress to req.Log, and returns the
// daemon's response and the progress (its steps and spans); a failed
// solve is classified (solveError).
func (b *BuildKit) solve(ctx context.Context, req BuildRequest, opt client.SolveOpt) (*client.SolveResponse, *progress, error) {
	p := newProgress(req.Log, b.opts.MaxLogLine)
	p.exporting = func() { StepsDone(ctx) }
	ch := make(chan *client.SolveStatus)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for s := range ch {
			p.update(s)
		}
	}()
	resp, err := b.c.Solve(ctx, nil, opt, ch) // closes ch
	<-done
	p.flush()
	if err != nil {
		return nil, p, b.solveError(ctx, req, p, err)
	}
	return resp, p, nil
}

// solveOpt turns req into a solve of the dockerfile.v0 frontend.
func (b *BuildKit) solveOpt(req BuildRequest) (client.SolveOpt, error) {
	target, err := imageTarget(req)
	if err != nil {
		return client.SolveOpt{}, err
	}
	df, err := dockerfileOf(req)
	if err != nil {
		return client.SolveOpt{}, err
	}
	if err := undeclaredBase(df.data, req, req.Modules); err != nil {
		return client.SolveOpt{}, err
	}
	if err := shadowedBase(df.data, req); err != nil {
		return client.SolveOpt{}, err
	}
	attrs, err := b.frontendAttrs(req, df.path)
	if err != nil {
		return client.SolveOpt{}, err
	}
	if note := b.syntax(df.data, attrs); note != "" && req.Log != nil {
		req.Log(note)
	}
	if req.Log != nil {
		for _, note := range secretNotes(df.data, req) {
			req.Log(note)
		}
	}
	opt := client.SolveOpt{
		Frontend:      "dockerfile.v0",
		FrontendAttrs: attrs,
		LocalMounts:   map[string]fsutil.FS{"context": df.context, "dockerfile": df.dir},
		Exports:       []client.ExportEntry{{Type: client.ExporterImage, Attrs: b.exportAttrs(req, target, attrs, df.data)}},
		Session:       []session.Attachable{b.auth},
		// Not recorded in buildkitd's build history (BuildKitOptions.History).
		Internal: !b.opts.History,
		// The daemon sends the context as a change against the last one it
		// was sent under the same key, as buildx keys a context by its
		// directory: keyed by module, a module's next build sends what its
		// sources changed, not the whole context again (with one key for
		// every build, the daemon compared each with another module's).
		SharedKey: "meshbuild-module:" + req.Module,
	}
	if req.Cache != "" {
		opt.CacheImports, opt.CacheExports = b.cacheOptions(req.Cache, req.Source.Compression)
	}
	return opt, nil
}

// syntax keeps the built-in Dockerfile frontend for a Dockerfile with a
// syntax directive, unless FollowSyntax, and says so (the note for the
// build's log; empty when there is no directive or it is followed). The
// frontend forwards a build to the image a directive names only when its
// attributes carry no cmdline (the attribute a forwarded frontend is
// invoked with): one present, empty, keeps the build in the daemon's own.
func (b *BuildKit) syntax(dockerfile []byte, attrs map[string]string) string {
	ref, _, _, ok := parser.DetectSyntax(dockerfile)
	if !ok || b.opts.FollowSyntax {
		return ""
	}
	attrs["cmdline"] = ""
	return fmt.Sprintf("syntax: the directive's frontend %s is not used: built with buildkitd's own Dockerfile frontend (build-agent --follow-syntax uses it)", ref)
}

// imageTarget is the name the image is pushed under: req.Image, with
// req.Tag when there is one. A malformed image or tag is a malformed ask.
func imageTarget(req BuildRequest) (string, error) {
	target := req.Image
	if req.Tag != "" {
		target += ":" + req.Tag
	}
	if named, err := reference.ParseNormalizedNamed(req.Image); err != nil || !reference.IsNameOnly(named) {
		return "", fmt.Errorf("%w: image %q: want a repository without tag or digest", mesh.ErrMalformedAsk, req.Image)
	} else if _, err := reference.WithTag(named, req.Tag); req.Tag != "" && err != nil {
		return "", fmt.Errorf("%w: tag %q: %v", mesh.ErrMalformedAsk, req.Tag, err)
	}
	return target, nil
}

// buildFiles are a build's context and Dockerfile, as the solve mounts
// them.
type buildFiles struct {
	context, dir fsutil.FS // the build context; the Dockerfile's directory
	path         string    // the Dockerfile
	data         []byte    // its content
}

// dockerfileOf finds req's Dockerfile (default "Dockerfile") in its
// context, or in req.DockerfileDir for one outside it: one outside the
// context without its directory, or missing, is ErrSource.
func dockerfileOf(req BuildRequest) (buildFiles, error) {
	df := dockerfileName(req)
	var dfPath string
	where := "the build context"
	if _, outside := mesh.DockerfileOutside(req.Source.Path, df); outside && req.DockerfileDir != "" {
		dfPath = filepath.Join(req.DockerfileDir, path.Base(path.Clean(filepath.ToSlash(df))))
		where = "its directory beside the build context"
	} else {
		rel, ok := relPath(filepath.ToSlash(df))
		if !ok || rel == "" {
			return buildFiles{}, classified(ErrSource, fmt.Sprintf("Dockerfile %q is not a file in the build context", df), nil)
		}
		dfPath = filepath.Join(req.ContextDir, filepath.FromSlash(rel))
	}
	rel := df
	if fi, err := os.Stat(dfPath); err != nil || !fi.Mode().IsRegular() {
		return buildFiles{}, classified(ErrSource, fmt.Sprintf("Dockerfile %q not found in %s", rel, where), err)
	}
	ctxFS, err := fsutil.NewFS(req.ContextDir)
	if err != nil {
		return buildFiles{}, classified(ErrSource, saying("build context "+req.ContextDir, err), err)
	}
	dfData, err := os.ReadFile(dfPath)
	if err != nil {
		return buildFiles{}, classified(ErrSource, saying(fmt.Sprintf("reading Dockerfile %q", rel), err), err)
	}
	dfFS, err := fsutil.NewFS(filepath.Dir(dfPath))
	if err != nil {
		return buildFiles{}, classified(ErrSource, saying("Dockerfile directory", err), err)
	}
	return buildFiles{context: ctxFS, dir: dfFS, path: dfPath, data: dfData}, nil
}

// frontendAttrs are the dockerfile frontend's attributes: the Dockerfile,
// the attestations asked for, SOURCE_DATE_EPOCH, the platform, and every
// base as a named context pinned to its digest.
func (b *BuildKit) frontendAttrs(req BuildRequest, dfPath string) (map[string]string, error) {
	// SOURCE_DATE_EPOCH as a build argument: the dockerfile frontend
	// clamps the image config's created time and its history to it, and
	// the daemon passes it on to the image exporter (control.go) as
	// source-date-epoch. The provenance and SBOM attributes (attest.go)
	// change the pushed index, not the image.
	attrs, _ := b.attestAttrs(req)
	attrs["filename"] = filepath.Base(dfPath)
	attrs["build-arg:SOURCE_DATE_EPOCH"] = strconv.FormatInt(b.opts.SourceDateEpoch, 10)
	if req.Platform != "" {
		attrs["platform"] = req.Platform
	}
	for _, base := range req.Bases {
		names, err := contextNames(base)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			attrs["context:"+n] = "docker-image://" + base.Ref()
		}
	}
	return attrs, nil
}

// exportAttrs are the image exporter's attributes: pushed to target (by
// digest without a tag), timestamps rewritten, the manifest annotated, and,
// with attestations (attrs), as an index by digest naming the image as
// its subject.
func (b *BuildKit) exportAttrs(req BuildRequest, target string, attrs map[string]string, dockerfile []byte) map[string]string {
	// rewrite-timestamp: every layer's file times are rewritten to the
	// epoch (a checkout's files carry the time it was written).
	exp := map[string]string{"name": target, "push": "true", "rewrite-timestamp": "true"}
	if req.Tag == "" {
		exp["push-by-digest"] = "true"
	}
	for k, v := range compressionAttrs(req.Source.Compression) {
		exp[k] = v
	}
	annotations := manifestAnnotations(req, dockerfile)
	for k, v := range annotations {
		exp["annotation-manifest."+k] = v
	}
	if attrs["attest:provenance"] != "" || attrs["attest:sbom"] != "" {
		// With attestations BuildKit pushes an index: it goes by digest,
		// and Build tags it once verified (the image in it is what the
		// mesh builds on; the index is reported beside it). The
		// attestation manifest names the image as its subject (an OCI
		// artifact): a referrer of the image (see registry.Refer).
		exp["name"], exp["push-by-digest"] = req.Image, "true"
		exp["oci-artifact"] = "true"
		for k, v := range indexAnnotations(req, annotations) {
			exp["annotation-index."+k] = v
		}
	}
	if b.opts.Registry.Insecure() {
		exp["registry.insecure"] = "true"
	}
	return exp
}

// slowExport is how long an export of gzip layers takes before the
// build's log says what build.compression: zstd would save.
const slowExport = time.Second

// slowExportNote is the build log's note on an export of gzip layers that
// took slowExport or longer: every export compresses the image's own
// layers again (their file times rewritten to the SOURCE_DATE_EPOCH), and
// zstd does that several times faster. Empty otherwise.
func slowExportNote(spans Spans, compression string) string {
	took := spans.Took(SpanExport)
	if took < slowExport || (compression != "" && compression != mesh.CompressionGzip) {
		return ""
	}
	return fmt.Sprintf("export: %s, most of it compressing this image's own layers with gzip, as every build does again (their file times are rewritten to the SOURCE_DATE_EPOCH, a fully cached build's too): build.compression: zstd in the module's manifest does that about 5 times faster (README, Manifests)", took.Round(10*time.Millisecond))
}

// compressionAttrs are the exporter attributes of a layer compression as
// the ask carries it (mesh.Source.Compression): none for gzip, BuildKit's
// default; zstd with OCI media types, which zstd layers need.
func compressionAttrs(compression string) map[string]string {
	if compression == "" || compression == mesh.CompressionGzip {
		return nil
	}
	return map[string]string{"compression": compression, "oci-mediatypes": "true"}
}

// cacheOptions import the build cache from ref and export it there (mode
// max, its layers compressed as the image's are; an export the registry
// refuses does not fail the build).
func (b *BuildKit) cacheOptions(ref, compression string) (imports, exports []client.CacheOptionsEntry) {
	cache := map[string]string{"ref": ref}
	if b.opts.Registry.Insecure() {
		cache["registry.insecure"] = "true"
	}
	export := map[string]string{"mode": "max", "ignore-error": "true"}
	for k, v := range compressionAttrs(compression) {
		export[k] = v
	}
	for k, v := range cache {
		export[k] = v
	}
	return []client.CacheOptionsEntry{{Type: "registry", Attrs: cache}}, []client.CacheOptionsEntry{{Type: "registry", Attrs: export}}
}

// contextNames are the names a base is supplied under as a named context:
// its module name and its repository. The dockerfile frontend looks a FROM
// name up after normalising it the way reference.ParseNormalizedNamed and
// FamiliarString do, with a ":latest" suffix dropped — so
// "127.0.0.1:5000/runtime" also catches "127.0.0.1:5000/runtime:latest",
// and a Docker Hub repository is looked up by its short name ("alpine" for
// "docker.io/library/alpine").
func contextNames(base mesh.Base) ([]string, error) {
	named, err := reference.ParseNormalizedNamed(base.Image)
	if err != nil || !reference.IsNameOnly(named) {
		return nil, fmt.Errorf("%w: base %s: image %q: want a repository without tag or digest", mesh.ErrMalformedAsk, base.Module, base.Image)
	}
	if _, err := digest.Parse(base.Digest); err != nil {
		return nil, fmt.Errorf("%w: base %s: digest %q: %v", mesh.ErrMalformedAsk, base.Module, base.Digest, err)
	}
	repo := reference.FamiliarName(named)
	if repo == base.Module {
		return []string{repo}, nil
	}
	return []string{base.Module, repo}, nil
}

// solveError classifies a failed solve by the causes table (errors.go).
//
// What BuildKit's errors carry over the wire is read first: the daemon gone
// (Unavailable), a process that exited non-zero (a RUN). A registry's
// answer BuildKit passes along only as text (containerd's "unexpected
// status from PUT request to …: 503 Service Unavailable", with the
// registry's code and message on the lines after), so its status is read
// from there; a push that failed for a reason of the registry's (5xx, or
// no status at all) is asked of the registry again, with a probe upload to
// the image's repository, so that its own words — the detail BuildKit
// drops, "no space left on device" — reach the message. Registries that do
// not answer a ping make it infrastructure too.
func (b *BuildKit) solveError(ctx context.Context, req BuildRequest, p *progress, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("build of %s: %w", req.Image, context.Cause(ctx))
	}
	msg := buildMessage(err, p)
	f := &failure{err: err, step: stepSolve}
	var exit *gatewaypb.ExitError
	if p.failedIn(isExport) && grpcerrors.Code(err) != codes.Unavailable && !errors.As(err, &exit) {
		// BuildKit drops the registry's detail: ask it again, in words.
		f.step = stepPush
		if perr := b.opts.Registry.ProbeUpload(ctx, req.Image); perr != nil && ctx.Err() == nil {
			msg += "; the registry says: " + lastLine(perr.Error())
			f.err = errors.Join(err, perr)
		}
	}
	var downHost string
	var downErr error
	asked := false
	f.down = func() (string, error) {
		if !asked {
			asked = true
			for _, host := range registryHosts(req) {
				if perr := b.opts.Registry.Ping(ctx, host); registry.IsInfra(perr) {
					downHost, downErr = host, perr
					break
				}
			}
		}
		return downHost, downErr
	}
	c := classOf(f)
	switch c.name {
	case "buildkitd unreachable":
		return classified(c.class, fmt.Sprintf("buildkitd at %s: %s", b.addr, msg), f.err)
	case "registry down":
		return classified(c.class, fmt.Sprintf("registry %s unavailable: %s", downHost, msg), errors.Join(f.err, downErr))
	case "registry unreachable":
		if host, hosts := unreachableHost(f.text()), registryHosts(req); host != "" && !askRegistry(hosts, host) {
			// Not a registry the ask names: what the Dockerfile fetches
			// itself (an ADD of a URL, an image of its own, a git
			// context). Infrastructure all the same — another machine, or
			// the same later, may reach it — but named for what it is.
			return classified(c.class, fmt.Sprintf("%s unreachable (not a registry of the ask's, %s: a URL, an image or a git context the Dockerfile fetches itself): %s", host, strings.Join(hosts, ", "), msg), f.err)
		}
		return classified(c.class, c.name+": "+msg, f.err)
	case "disk full":
		return classified(c.class, c.name+": "+msg, f.err)
	}
	if f.status != 0 {
		return classified(c.class, fmt.Sprintf("%s (%d %s): %s", c.name, f.status, http.StatusText(f.status), msg), f.err)
	}
	return classified(c.class, msg, f.err)
}

// registryError classifies a registry call made after the build by the
// causes table: infrastructure when the registry could not be reached or
// answered 5xx, 408 or 429; else the push's.
func registryError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, context.Cause(ctx))
	}
	f := &failure{err: err, step: stepRegistry}
	c := classOf(f)
	if f.status != 0 {
		return classified(c.class, fmt.Sprintf("%s: %s (%d %s): %s", what, c.name, f.status, http.StatusText(f.status), lastLine(err.Error())), err)
	}
	return classified(c.class, what+": "+c.name+": "+lastLine(err.Error()), err)
}

// hostInError finds, in an error's text, the host a failed connection was
// to: the URL's (`Get "https://example.com/file"`), else the address
// dialled (`dial tcp 10.0.0.1:443`), else the name looked up (`lookup
// example.com`).
var hostInError = []*regexp.Regexp{
	regexp.MustCompile(`"https?://([^/"?#]+)`),
	regexp.MustCompile(`dial tcp ([^ ]+?): `),
	regexp.MustCompile(`lookup ([^ :]+)`),
}

// unreachableHost is the host an unreachable error names ("" when it
// names none); a URL's or address's default port is dropped, as a
// reference's domain has none.
func unreachableHost(text string) string {
	for _, re := range hostInError {
		if m := re.FindStringSubmatch(text); m != nil {
			h := m[1]
			for _, port := range []string{":443", ":80"} {
				h = strings.TrimSuffix(h, port)
			}
			return h
		}
	}
	return ""
}

// askRegistry reports whether host is one of hosts (registryHosts), a
// Docker Hub host counting as docker.io.
func askRegistry(hosts []string, host string) bool {
	if strings.HasSuffix(host, ".docker.io") {
		host = "docker.io"
	}
	return slices.Contains(hosts, host)
}

// registryHosts are the registries a build talks to: the target's, the
// bases' and the cache's.
func registryHosts(req BuildRequest) []string {
	var hosts []string
	add := func(ref string) {
		named, err := reference.ParseNormalizedNamed(ref)
		if err != nil {
			return
		}
		h := reference.Domain(named)
		for _, x := range hosts {
			if x == h {
				return
			}
		}
		hosts = append(hosts, h)
	}
	add(req.Image)
	for _, base := range req.Bases {
		add(base.Image)
	}
	if req.Cache != "" {
		add(req.Cache)
	}
	return hosts
}

// buildMessage is the one line a person needs: the error's last meaningful
// line, located in the Dockerfile when BuildKit says where, and the failed
// step's last line of output when it printed one.
func buildMessage(err error, p *progress) string {
	msg := lastLine(err.Error())
	if _, ok := registry.Status(err); ok {
		// The registry's status and, on the lines after, its own words.
		msg = registryWords(err)
	}
	msg = strings.TrimPrefix(msg, "failed to solve: ")
	for _, src := range errdefs.Sources(err) {
		if src.Info == nil || len(src.Ranges) == 0 || src.Ranges[0].Start == nil {
			continue
		}
		msg = fmt.Sprintf("%s:%d: %s", src.Info.Filename, src.Ranges[0].Start.Line, msg)
		break
	}
	if out := p.failedOutput(); out != "" && !strings.Contains(msg, out) {
		msg += ": " + out
	}
	return msg
}
