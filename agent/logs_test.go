package agent

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// The batcher needs only a publish function: batches come numbered in
// order, bounded by lines, the last marked final, and the tail is kept.
func TestLogBatcherPublishesNumberedBatchesAndKeepsTheTail(t *testing.T) {
	var mu sync.Mutex
	var got []mesh.LogBatch
	publish := func(b mesh.LogBatch) { mu.Lock(); got = append(got, b); mu.Unlock() }
	// A flush interval no test waits for: only the line bound and Close
	// publish here.
	b := newLogBatcher(publish, "a1", 3, time.Hour, 2)
	for i := range 7 {
		b.Line(fmt.Sprint("line ", i))
	}
	b.Close()
	mu.Lock()
	defer mu.Unlock()
	var lines []string
	for i, batch := range got {
		if batch.Ask != "a1" || batch.Seq != i+1 || batch.Final != (i == len(got)-1) || len(batch.Lines) > 3 {
			t.Errorf("batch %d: %+v: want ask a1, seq %d, at most 3 lines, final only last", i, batch, i+1)
		}
		lines = append(lines, batch.Lines...)
	}
	if len(got) != 3 || len(lines) != 7 || lines[6] != "line 6" {
		t.Fatalf("%d batches, lines %q: want 3 batches carrying all 7 lines in order", len(got), lines)
	}
	if tail := b.Tail(); len(tail) != 2 || tail[0] != "line 5" || tail[1] != "line 6" {
		t.Fatalf("tail %q: want the last two lines", tail)
	}
}
