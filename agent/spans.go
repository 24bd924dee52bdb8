package agent

import (
	"fmt"
	"strings"
	"time"
)

// Span is one timed part of a build: where its time went. A Result carries
// its build's spans in the order they ran; the parts of the solve that
// buildkitd reports (cache import, steps, export, cache export) are timed by the
// daemon's clock and lie inside the solve's span.
type Span struct {
	Name string
	Took time.Duration
}

// The spans of a build, as BuildWorker and BuildKit record them.
const (
	// SpanCheckout is the source checked out of the workspace's clone
	// (a fetch when the commit is new) and written to the build context.
	SpanCheckout = "checkout"
	// SpanPing is the daemon asked whether it answers, before the solve,
	// and at once its version and the registry whether it holds the input
	// key's build cache already (cachemark.go).
	SpanPing = "ping"
	// SpanSolve is the solve in buildkitd, from the request to its answer:
	// the steps, the image exported and pushed, the cache exported.
	SpanSolve = "solve"
	// SpanCacheImport is buildkitd reading the registry build cache's
	// manifest (inside the solve).
	SpanCacheImport = "cache-import"
	// SpanSteps is the Dockerfile's own steps ("[2/3] RUN …"), from the
	// first one's start to the last one's completion (inside the solve;
	// near nothing when every step came from a cache): the rest of the
	// solve beside the cache's import and export and the image's export
	// is the build's overhead in buildkitd (the definition and the bases'
	// metadata loaded, the bases' layers pulled).
	SpanSteps = "steps"
	// SpanExport is buildkitd exporting the image and pushing it (inside
	// the solve).
	SpanExport = "export"
	// SpanCacheExport is buildkitd exporting the build cache to the
	// registry (inside the solve).
	SpanCacheExport = "cache-export"
	// SpanVerify is the registry asked for what was pushed: the digest
	// resolved, the image and its attestations read, its size, the tag.
	SpanVerify = "verify"
)

// inSolvePart reports whether a span lies inside the solve's.
func inSolvePart(name string) bool {
	return name == SpanCacheImport || name == SpanSteps || name == SpanExport || name == SpanCacheExport
}

// Spans are a build's spans.
type Spans []Span

// add appends a span.
func (s *Spans) add(name string, took time.Duration) { *s = append(*s, Span{Name: name, Took: took}) }

// Took is the total of the spans named name (0 if there are none).
func (s Spans) Took(name string) time.Duration {
	var d time.Duration
	for _, x := range s {
		if x.Name == name {
			d += x.Took
		}
	}
	return d
}

// String is the spans as a build log's last line puts them: "checkout
// 4ms, ping 1ms, solve 120ms (cache-import 12ms, export 40ms), verify 6ms".
func (s Spans) String() string {
	var b strings.Builder
	inSolve := false
	for i, x := range s {
		inner := inSolvePart(x.Name)
		switch {
		case inner && !inSolve:
			b.WriteString(" (")
			inSolve = true
		case inner:
			b.WriteString(", ")
		case inSolve:
			b.WriteString("), ")
			inSolve = false
		case i > 0:
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", x.Name, x.Took.Round(time.Millisecond))
	}
	if inSolve {
		b.WriteString(")")
	}
	return b.String()
}
