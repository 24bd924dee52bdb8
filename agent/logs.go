package agent

import (
	"sync"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// logBatcher publishes a build's output in batches bounded by lines and
// time, numbered in order and the last marked final, and keeps the last
// lines for a failed.
type logBatcher struct {
	pub   func(mesh.LogBatch) // publishes one batch (the agent's: on log.<ask>)
	ask   string
	max   int
	keep  int
	mu    sync.Mutex
	pubMu sync.Mutex // keeps batches in seq order
	buf   []string
	tail  []string
	seq   int
	stop  chan struct{}
	done  chan struct{}
	flush time.Duration
}

func newLogBatcher(publish func(mesh.LogBatch), ask string, maxLines int, flush time.Duration, keep int) *logBatcher {
	b := &logBatcher{pub: publish, ask: ask, max: maxLines, keep: keep, flush: flush, stop: make(chan struct{}), done: make(chan struct{})}
	go b.loop()
	return b
}

// Line adds one line of output.
func (b *logBatcher) Line(line string) {
	if len(line) > 4096 {
		line = line[:4096] + "…"
	}
	b.mu.Lock()
	b.buf = append(b.buf, line)
	b.tail = append(b.tail, line)
	if len(b.tail) > b.keep {
		b.tail = b.tail[len(b.tail)-b.keep:]
	}
	full := len(b.buf) >= b.max
	b.mu.Unlock()
	if full {
		b.publish(false)
	}
}

// Tail returns the last lines.
func (b *logBatcher) Tail() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.tail...)
}

// Close publishes what is left, marked final.
func (b *logBatcher) Close() {
	close(b.stop)
	<-b.done
	b.publish(true)
}

func (b *logBatcher) loop() {
	defer close(b.done)
	t := time.NewTicker(b.flush)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.publish(false)
		}
	}
}

func (b *logBatcher) publish(final bool) {
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	b.mu.Lock()
	lines := b.buf
	b.buf = nil
	if len(lines) == 0 && !final {
		b.mu.Unlock()
		return
	}
	b.seq++
	batch := mesh.LogBatch{Ask: b.ask, Seq: b.seq, Lines: lines, Final: final}
	b.mu.Unlock()
	b.pub(batch)
}
