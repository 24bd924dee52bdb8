package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// BenchmarkLayerCompression is what an image's own layer costs its
// builds, by build.compression: a module whose RUN writes 16 MB that do
// not compress and 28 MB of text (seq) — an image's own layer of a size
// real ones have, which BenchmarkAgentOverhead's byte-sized layers leave
// out. Every export rewrites the layers' file times to the
// SOURCE_DATE_EPOCH (rewrite-timestamp), which BuildKit does by
// uncompressing and compressing every own layer again, on every build, a
// fully cached one too: so the cached build's export is a compression of
// the layer, the cold one's two. For each of gzip and zstd, on a daemon
// of its own: one cold build (the RUN run), then cachedBuilds fully
// cached builds of the same ask, each at a commit of its own with the same
// tree (the same input key: its cache imported and not exported again;
// the same image, pushed again under another index), each timed end to
// end (Result.Duration); then the cold build's ask again, answered with
// what it pushed (BuildKit.reuse).
// MESHBUILD_BENCH=tiny: a 1 MB layer, 2 cached builds.
//
//	MESHBUILD_BUILDKIT=1 go test -run XXX -bench BenchmarkLayerCompression -benchtime 1x ./agent
func BenchmarkLayerCompression(b *testing.B) {
	testenv.RequireBuildkit(b)
	random, text, cachedBuilds := 16_000_000, 4_000_000, 7
	if os.Getenv("MESHBUILD_BENCH") == "tiny" {
		random, text, cachedBuilds = 500_000, 100_000, 2
	}
	ctx := context.Background()
	host := registrytest.Registry(b)
	base := testenv.Busybox(b, host)
	dir := b.TempDir()
	df := "FROM runtime\nRUN head -c " + strconv.Itoa(random) + " /dev/urandom > /random && seq 1 " + strconv.Itoa(text) + " > /text\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		for _, c := range []struct{ name, compression string }{{"gzip", ""}, {"zstd", mesh.CompressionZstd}} {
			bk, err := NewBuildKit(testenv.Buildkitd(b, host), BuildKitOptions{})
			if err != nil {
				b.Fatal(err)
			}
			req := BuildRequest{ContextDir: dir, Ask: mesh.Ask{
				Module: "layers", Image: host + "/layers-" + c.name, Cache: host + "/cache:layers-" + c.name, Key: "layers-" + c.name,
				Source: mesh.Source{Compression: c.compression},
				Bases:  []mesh.Base{{Module: "runtime", Image: host + "/busybox", Digest: digestOf(base)}},
			}}
			cold, err := bk.Build(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			var totals, exports []time.Duration
			for i := range cachedBuilds {
				// Each at a commit of its own (the same tree): the image
				// the same, its index another, so exported.
				req.Source.Commit = fmt.Sprintf("%040d", i+1)
				r, err := bk.Build(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if r.Digest != cold.Digest || r.CacheHits == 0 || r.Spans.Took(SpanExport) == 0 {
					b.Fatalf("%s: a cached build pushed %s with %d steps of %d cached, its export %s; the cold one %s", c.name, r.Digest, r.CacheHits, r.Steps, r.Spans.Took(SpanExport), cold.Digest)
				}
				totals, exports = append(totals, r.Duration), append(exports, r.Spans.Took(SpanExport))
			}
			// The cold build's commit again: what it pushed is the
			// answer, not exported again (BuildKit.reuse).
			req.Source.Commit = ""
			reused, err := bk.Build(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if reused.Digest != cold.Digest || reused.Spans.Took(SpanExport) != 0 {
				b.Fatalf("%s: the cold build's ask again pushed %s, its export %s; want %s not exported again", c.name, reused.Digest, reused.Spans.Took(SpanExport), cold.Digest)
			}
			b.ReportMetric(ms(reused.Duration), c.name+"-reused-ms")
			bk.Close()
			slices.Sort(totals)
			slices.Sort(exports)
			b.ReportMetric(ms(cold.Duration), c.name+"-cold-ms")
			b.ReportMetric(ms(cold.Spans.Took(SpanExport)), c.name+"-cold-export-ms")
			b.ReportMetric(ms(totals[len(totals)/2]), c.name+"-cached-ms")
			b.ReportMetric(ms(exports[len(exports)/2]), c.name+"-cached-export-ms")
			b.ReportMetric(float64(cold.Bytes)/1e6, c.name+"-image-MB")
		}
	}
	b.ReportMetric(float64(random+seqBytes(text))/1e6, "layer-uncompressed-MB")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// seqBytes is the length of `seq 1 n`'s output.
func seqBytes(n int) int {
	total := 0
	for lo, digits := 1, 1; lo <= n; lo, digits = lo*10, digits+1 {
		total += (min(n, lo*10-1) - lo + 1) * (digits + 1)
	}
	return total
}
