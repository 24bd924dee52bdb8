package agent

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/moby/buildkit/client"
	digest "github.com/opencontainers/go-digest"
)

// The BuildKit progress parser: a solve's status stream turned into the
// lines of log.<ask>, and the counts and the failed step a result and a
// failure need.

// Vertex names that are BuildKit's export of the result.
var exportRE = regexp.MustCompile(`^(exporting |pushing |writing image|naming to|preparing build cache for export)`)

func isExport(name string) bool { return exportRE.MatchString(name) }

// stepRE matches the vertices of the Dockerfile's own steps, which the
// dockerfile frontend names "[stage N/M] INSTRUCTION …" ("[2/3] RUN …"),
// and of a FROM answered by a named context, "[context runtime] <ref>"
// (but not that context's "load metadata for <ref>").
var stepRE = regexp.MustCompile(`^\[(context [^\]]+|[^\]]*\b\d+/\d+)\] `)

func isStep(name string) bool {
	return stepRE.MatchString(name) && !strings.Contains(name, "] load metadata for ")
}

// progress follows a solve's status stream: it numbers vertices as they
// appear, passes their names and output to log, and counts steps and cache
// hits.
type progress struct {
	log     func(string)
	maxLine int

	vertices map[digest.Digest]*vertex
	partial  map[logKey][]byte
	next     int
	failed   *vertex
	// exporting, when set, is called as the image's export starts: the
	// build's own steps are done (StepsDone).
	exporting func()
}

type vertex struct {
	n         int
	name      string
	started   bool
	completed bool
	// start and end are the daemon's times of the vertex's start and
	// completion.
	start, end time.Time
	cached     bool
	err        string
	lastLine   string
}

type logKey struct {
	v      digest.Digest
	stream int
}

func newProgress(log func(string), maxLine int) *progress {
	if log == nil {
		log = func(string) {}
	}
	return &progress{log: log, maxLine: maxLine, vertices: map[digest.Digest]*vertex{}, partial: map[logKey][]byte{}}
}

func (p *progress) line(s string) {
	if len(s) > p.maxLine {
		s = s[:p.maxLine] + "…"
	}
	p.log(s)
}

func (p *progress) update(s *client.SolveStatus) {
	for _, v := range s.Vertexes {
		x, ok := p.vertices[v.Digest]
		if !ok {
			p.next++
			x = &vertex{n: p.next, name: v.Name}
			p.vertices[v.Digest] = x
		}
		if v.Started != nil && !x.started {
			x.started = true
			x.start = *v.Started
			p.line(fmt.Sprintf("#%d %s", x.n, x.name))
			if p.exporting != nil && imageExportRE.MatchString(x.name) {
				p.exporting()
			}
		}
		if v.Cached && !x.cached {
			x.cached = true
			p.line(fmt.Sprintf("#%d CACHED", x.n))
		}
		if v.Error != "" && x.err == "" {
			x.err = v.Error
			p.failed = x
			p.line(fmt.Sprintf("#%d ERROR: %s", x.n, v.Error))
		}
		if v.Completed != nil && !x.completed {
			x.completed = true
			x.end = *v.Completed
			if v.Started != nil && !x.cached && x.err == "" {
				p.line(fmt.Sprintf("#%d DONE %.1fs", x.n, v.Completed.Sub(*v.Started).Seconds()))
			}
		}
	}
	for _, l := range s.Logs {
		k := logKey{l.Vertex, l.Stream}
		buf := append(p.partial[k], l.Data...)
		for {
			i := strings.IndexByte(string(buf), '\n')
			if i < 0 {
				break
			}
			p.output(l.Vertex, string(buf[:i]))
			buf = buf[i+1:]
		}
		if len(buf) > p.maxLine { // a line that never ends is cut, not held
			p.output(l.Vertex, string(buf))
			buf = nil
		}
		p.partial[k] = buf
	}
	for _, w := range s.Warnings {
		p.line("WARNING: " + strings.TrimSpace(string(w.Short)))
	}
}

func (p *progress) output(v digest.Digest, s string) {
	s = strings.TrimRight(s, "\r")
	n := 0
	if x, ok := p.vertices[v]; ok {
		n = x.n
		if t := strings.TrimSpace(s); t != "" {
			if len(t) > p.maxLine {
				t = t[:p.maxLine] + "…"
			}
			x.lastLine = t
		}
	}
	p.line(fmt.Sprintf("#%d %s", n, s))
}

// flush passes on output that did not end in a newline.
func (p *progress) flush() {
	for k, buf := range p.partial {
		if len(buf) > 0 {
			p.output(k.v, string(buf))
		}
		delete(p.partial, k)
	}
}

func (p *progress) counts() (steps, hits int) {
	for _, x := range p.vertices {
		if isStep(x.name) {
			steps++
			if x.cached {
				hits++
			}
		}
	}
	return steps, hits
}

// ownSteps counts the Dockerfile's own steps the solve reported ("[2/3]
// RUN …", of every stage built), and those answered from the cache.
func (p *progress) ownSteps() (steps, cached int) {
	for _, x := range p.vertices {
		if ownStepRE.MatchString(x.name) {
			steps++
			if x.cached {
				cached++
			}
		}
	}
	return steps, cached
}

// took is how long the vertices whose names match ran, by the daemon's
// clock: from the first one's start to the last one's completion.
func (p *progress) took(match func(name string) bool) time.Duration {
	var first, last time.Time
	for _, x := range p.vertices {
		if !match(x.name) || !x.started || !x.completed {
			continue
		}
		if first.IsZero() || x.start.Before(first) {
			first = x.start
		}
		if x.end.After(last) {
			last = x.end
		}
	}
	return last.Sub(first)
}

// Vertex names of the solve's spans (spans.go).
var (
	cacheImportRE = regexp.MustCompile(`^importing cache manifest from `)
	imageExportRE = regexp.MustCompile(`^exporting to image`)
	cacheExportRE = regexp.MustCompile(`^(exporting cache to |preparing build cache for export)`)
	// ownStepRE is a Dockerfile's own step, "[2/3] RUN …" or "[build
	// 2/3] RUN …" (stepRE without the named contexts' vertices).
	ownStepRE = regexp.MustCompile(`^\[([^\]]*\s)?\d+/\d+\] `)
)

// solveSpans are the parts of the solve the daemon reported.
func (p *progress) solveSpans() Spans {
	var s Spans
	for _, x := range []struct {
		name string
		re   *regexp.Regexp
	}{{SpanCacheImport, cacheImportRE}, {SpanSteps, ownStepRE}, {SpanExport, imageExportRE}, {SpanCacheExport, cacheExportRE}} {
		if d := p.took(x.re.MatchString); d > 0 {
			s.add(x.name, d)
		}
	}
	return s
}

// failedIn reports whether the vertex that failed matches.
func (p *progress) failedIn(match func(name string) bool) bool {
	return p.failed != nil && match(p.failed.name)
}

// failedOutput is the last line the failed vertex printed.
func (p *progress) failedOutput() string {
	if p.failed == nil {
		return ""
	}
	return p.failed.lastLine
}
