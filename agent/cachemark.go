package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/distribution/reference"
	"github.com/moby/buildkit/client"
	ocispecs "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/meshbuild/meshbuild/registry"
)

// # A build cache exported once per input key
//
// A build's registry cache (the ask's Cache, mode=max) holds the cache
// records of every step of the build that exported it. BuildKit exports it
// after every solve, even one in which every step came from that very
// cache: in a fleet, a fully cached build spends tens of milliseconds
// writing back what the registry already holds. Builds of the same input
// key (the ask's Key: the module, the platform, the build context's tree,
// the Dockerfile, every base's digest) on machines alike solve the same
// definition and export the same records. So a build that exported its
// cache leaves a note beside it, under the cache's tag with "-mark"
// appended (cacheMark): an empty image whose manifest annotations name the
// cache manifest just exported and the key it was exported for — a hash of
// the input key, this machine's SOURCE_DATE_EPOCH (which the RUN steps
// see) and its BuildKit's version. A later build, on any machine, reads
// the note and the cache's tag at once before its solve: when the note
// names its key and the manifest the cache's tag names, nothing in the
// cache would change, and the cache is not exported. When another key's
// build has exported since, they differ and the cache is exported as
// before. One note per cache, moved by each export: old caches are left
// untagged, for the registry's garbage collection, as before. An ask
// without a key always exports.

// The note's annotations. Besides the key and the cache manifest, the
// note names what the build that exported the cache pushed (its exporter
// response's containerimage.digest: the index, with attestations) and a
// hash of everything that export was asked to write (exportFingerprint):
// a later build of the same key and the same fingerprint whose every step
// comes from the cache would push that very image again, and is answered
// with it instead (BuildKit.reuse).
const (
	annotationCacheKey      = "dev.meshbuild.cache.key"
	annotationCacheManifest = "dev.meshbuild.cache.manifest"
	annotationCachePushed   = "dev.meshbuild.cache.pushed"
	annotationCacheExport   = "dev.meshbuild.cache.export"
)

// responseCacheManifest is BuildKit's exporter response key for the cache
// manifest a solve exported (remotecache.ExporterResponseManifestDesc): a
// descriptor, as JSON.
const responseCacheManifest = "cache.manifest"

// cacheMark is where the note on a build cache goes and the key a build
// would note there.
type cacheMark struct {
	// note is the note's reference: the cache's repository, its tag with
	// "-mark" appended.
	note string
	// key is the hash of the input key, the SOURCE_DATE_EPOCH and the
	// BuildKit version.
	key string
}

// cacheMarkFor is req's mark on a machine with epoch as its
// SOURCE_DATE_EPOCH and daemon as its BuildKit (another BuildKit may key
// the same steps' cache otherwise). ok is false when req has no key or no
// cache.
func cacheMarkFor(req BuildRequest, epoch int64, daemon string) (mark cacheMark, ok bool) {
	if req.Key == "" || req.Cache == "" {
		return cacheMark{}, false
	}
	named, err := reference.ParseNormalizedNamed(req.Cache)
	if err != nil {
		return cacheMark{}, false
	}
	tag := "latest"
	if t, isTagged := named.(reference.Tagged); isTagged {
		tag = t.Tag()
	}
	tag += "-mark"
	if len(tag) > 128 {
		return cacheMark{}, false
	}
	h := sha256.Sum256([]byte(req.Key + "\x00" + strconv.FormatInt(epoch, 10) + "\x00" + daemon))
	return cacheMark{note: reference.TrimNamed(named).String() + ":" + tag, key: hex.EncodeToString(h[:])}, true
}

// cacheMarkOf is req's mark on this machine (cacheMarkFor), its daemon's
// version asked; ok is false without a key or a version.
func (b *BuildKit) cacheMarkOf(ctx context.Context, req BuildRequest) (cacheMark, bool) {
	if req.Key == "" || req.Cache == "" {
		return cacheMark{}, false
	}
	info, err := b.c.Info(ctx)
	if err != nil {
		return cacheMark{}, false
	}
	v := info.BuildkitVersion
	return cacheMarkFor(req, b.opts.SourceDateEpoch, v.Package+" "+v.Version+" "+v.Revision)
}

// cacheHeld reports whether req's build cache already holds what a build
// of its input key exports: the note beside it names mark's key and the
// manifest the cache's tag names. Any error — no cache or no note yet, a
// registry that does not answer — is false: the cache is exported as
// before.
//
// absent is the registry's answer that there is no cache at all (404): the
// module's first build, or one on a new registry. There is nothing to
// import then, and the import is left out: BuildKit would ask for it, and
// print its "not found" among the build's output as an ERROR.
//
// note is the note itself when held: what the export that made it pushed.
func (b *BuildKit) cacheHeld(ctx context.Context, req BuildRequest, mark cacheMark) (held, absent bool, note map[string]string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		note, _ = b.opts.Registry.Note(ctx, mark.note)
	}()
	cache, err := b.opts.Registry.Head(ctx, req.Cache)
	<-done
	if err != nil {
		return false, registry.IsNotFound(err), nil
	}
	if note[annotationCacheKey] != mark.key || note[annotationCacheManifest] != cache.Digest.String() {
		return false, false, nil
	}
	return true, false, note
}

// markCache leaves the note on the cache manifest a solve exported (its
// exporter response): exported for mark's key, with what the solve pushed
// and the fingerprint of its export. It does nothing when no cache was
// exported.
func (b *BuildKit) markCache(ctx context.Context, mark cacheMark, resp map[string]string, export string) error {
	raw := resp[responseCacheManifest]
	if raw == "" {
		return nil
	}
	var desc ocispecs.Descriptor
	if err := json.Unmarshal([]byte(raw), &desc); err != nil || desc.Digest == "" {
		return fmt.Errorf("buildkitd's cache manifest descriptor %q: %v", raw, err)
	}
	note := map[string]string{annotationCacheKey: mark.key, annotationCacheManifest: desc.Digest.String()}
	if pushed := resp["containerimage.digest"]; pushed != "" && export != "" {
		note[annotationCachePushed], note[annotationCacheExport] = pushed, export
	}
	return b.opts.Registry.PutNote(ctx, mark.note, note)
}

// exportFingerprint is a hash of everything opt asks the daemon to make and
// write besides the steps' results: the frontend's attributes (the
// Dockerfile, the platform, the build arguments and SOURCE_DATE_EPOCH,
// every base pinned by digest, the revision, the attestations asked for)
// and the image exporter's (the target, the annotations, the compression).
// Two solves of the same input key and the same fingerprint whose every
// step is cached push the same image.
func exportFingerprint(opt client.SolveOpt) string {
	h := sha256.New()
	write := func(kind string, m map[string]string) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(h, "%s %d:%s %d:%s\n", kind, len(k), k, len(m[k]), m[k])
		}
	}
	write("frontend", opt.FrontendAttrs)
	for _, e := range opt.Exports {
		write("export "+e.Type, e.Attrs)
	}
	return hex.EncodeToString(h.Sum(nil))
}
