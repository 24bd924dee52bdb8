package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/distribution/reference"
	ocispecs "github.com/opencontainers/image-spec/specs-go/v1"
)

// # A build cache exported once per input key
//
// A build's registry cache (the ask's Cache, mode=max) holds the cache
// records of every step of the build that exported it. BuildKit exports it
// after every solve, even one in which every step came from that very
// cache: in a fleet, a fully cached build spends tens of milliseconds
// writing back what the registry already holds. Builds of the same input
// key (the ask's Key: the module, the platform, the build context's tree,
// the Dockerfile, every base's digest) solve the same definition and
// export the same records, so a build that exported its cache also tags
// that cache manifest with a tag derived from its key, this machine's
// SOURCE_DATE_EPOCH (which the RUN steps see) and its BuildKit's version:
// cacheKeyTag. A later build
// of the same key, on any machine, finds the cache tag and the key's tag
// naming the same manifest and does not export the cache again: nothing in
// it would change. When another key's build has exported since, the two
// differ and the cache is exported as before. An ask without a key always
// exports.

// responseCacheManifest is BuildKit's exporter response key for the cache
// manifest a solve exported (remotecache.ExporterResponseManifestDesc): a
// descriptor, as JSON.
const responseCacheManifest = "cache.manifest"

// cacheMark is the tag, in the build cache's repository, marking the
// cache manifest exported by a build of one input key (cacheKeyTag).
type cacheMark struct {
	repo, tag string
}

// cacheKeyTag is the mark of req's input key for a machine with epoch as
// its SOURCE_DATE_EPOCH and daemon as its BuildKit (the version: another
// BuildKit may key the same steps' cache otherwise): the tag "<cache
// tag>-k<32 hex>" in the build cache's repository. ok is false when req
// has no key or no cache.
func cacheKeyTag(req BuildRequest, epoch int64, daemon string) (mark cacheMark, ok bool) {
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
	h := sha256.Sum256([]byte(req.Key + "\x00" + strconv.FormatInt(epoch, 10) + "\x00" + daemon))
	tag += "-k" + hex.EncodeToString(h[:16])
	if len(tag) > 128 {
		return cacheMark{}, false
	}
	return cacheMark{repo: reference.TrimNamed(named).String(), tag: tag}, true
}

// cacheMarkOf is req's mark on this machine (cacheKeyTag), its daemon's
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
	return cacheKeyTag(req, b.opts.SourceDateEpoch, v.Package+" "+v.Version+" "+v.Revision)
}

// cacheHeld reports whether req's build cache already holds what a build
// of its input key exports: the cache tag and the key's mark name the same
// manifest. Any error — the cache or the mark not there yet, a registry
// that does not answer — is false: the cache is exported as before.
func (b *BuildKit) cacheHeld(ctx context.Context, req BuildRequest, mark cacheMark) bool {
	var markDigest string
	done := make(chan struct{})
	go func() {
		defer close(done)
		if d, err := b.opts.Registry.Head(ctx, mark.repo+":"+mark.tag); err == nil {
			markDigest = d.Digest.String()
		}
	}()
	cache, err := b.opts.Registry.Head(ctx, req.Cache)
	<-done
	return err == nil && markDigest != "" && cache.Digest.String() == markDigest
}

// markCache tags the cache manifest a solve exported (its exporter
// response) with req's mark, so that later builds of the key need not
// export it again. It does nothing when no cache was exported.
func (b *BuildKit) markCache(ctx context.Context, mark cacheMark, resp map[string]string) error {
	raw := resp[responseCacheManifest]
	if raw == "" {
		return nil
	}
	var desc ocispecs.Descriptor
	if err := json.Unmarshal([]byte(raw), &desc); err != nil || desc.Digest == "" {
		return fmt.Errorf("buildkitd's cache manifest descriptor %q: %v", raw, err)
	}
	ref := mark.repo + "@" + desc.Digest.String()
	m, err := b.opts.Registry.Get(ctx, ref)
	if err != nil {
		return err
	}
	return b.opts.Registry.TagFetched(ctx, ref, m, mark.tag)
}
