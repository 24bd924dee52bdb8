package agent

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// logBatcher publishes a build's output on log.<ask> in batches bounded by
// lines and time, and keeps the last lines for a failed.
type logBatcher struct {
	a     *Agent
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

func newLogBatcher(a *Agent, ask string, maxLines int, flush time.Duration, keep int) *logBatcher {
	b := &logBatcher{a: a, ask: ask, max: maxLines, keep: keep, flush: flush, stop: make(chan struct{}), done: make(chan struct{})}
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
	batch := mesh.LogBatch{Ask: b.ask, On: b.a.cfg.Machine, Seq: b.seq, Lines: lines, Final: final}
	b.mu.Unlock()
	data, err := json.Marshal(batch)
	if err != nil {
		return
	}
	// Logs are best effort: core publish, kept by LOGS.
	if err := b.a.nc.Publish(mesh.SeatEventSubject(mesh.BuildSeat, mesh.LogEvent(b.ask)), data); err != nil {
		b.a.log.Warn("publishing build output", "ask", b.ask, "err", err)
	}
}
