package agent

import (
	"cmp"
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// # Checkouts kept by tree
//
// A checkout is the git tree of an ask's context path written to disk, and
// the same tree is asked for again and again: every module of a forced
// rebuild, every module below a changed base (its own sources unchanged),
// the same module for each of its platforms. Sources keeps each tree it
// wrote under Dir/work/tree-<id>/context, named by the tree's object id, and
// hands the same directory to every build of that tree: builds only read
// their context (BuildKit copies it into the daemon), so slots building
// one tree at once share it. Released trees no build uses are kept, the
// KeepTrees most recently used, and the rest removed; what an earlier
// process left there is removed before the first checkout.

// DefaultKeepTrees is how many released checkouts Sources keeps for the
// next build of the same tree when Sources.KeepTrees is 0.
const DefaultKeepTrees = 16

// tree is one checkout on disk: its directory, the builds using it, and,
// until it is written, ready open (err says why writing it failed).
type tree struct {
	id    string
	dir   string // …/work/tree-<id>/context
	refs  int
	used  uint64 // when it was last released, in releases
	ready chan struct{}
	err   error
}

// trees is the set of checkouts on disk, by tree id.
type trees struct {
	mu    sync.Mutex
	byID  map[string]*tree
	clock uint64
}

// take returns the checkout of tree id, writing it with write (into a new
// directory) when it is not on disk yet. Concurrent takes of one id write
// it once; each take is matched by one give.
func (ts *trees) take(ctx context.Context, workRoot, id string, write func(dir string) error) (*tree, error) {
	ts.mu.Lock()
	if ts.byID == nil {
		ts.byID = map[string]*tree{}
		// What an earlier process left in the workspace (one process
		// uses it at a time) is removed before the first checkout.
		sweep(workRoot)
	}
	t, ok := ts.byID[id]
	if ok {
		t.refs++
		ts.mu.Unlock()
		select {
		case <-t.ready:
		case <-ctx.Done():
			ts.unref(t)
			return nil, ctx.Err()
		}
		if t.err != nil {
			ts.unref(t)
			return nil, t.err
		}
		return t, nil
	}
	t = &tree{id: id, dir: filepath.Join(workRoot, "tree-"+id, "context"), refs: 1, ready: make(chan struct{})}
	ts.byID[id] = t
	ts.mu.Unlock()

	// What an earlier process left under this name (it may have stopped
	// half way through writing it) is written again.
	t.err = rewrite(t.dir, write)
	if t.err != nil {
		ts.mu.Lock()
		delete(ts.byID, id) // the next take writes it again
		ts.mu.Unlock()
	}
	close(t.ready)
	if t.err != nil {
		return nil, t.err
	}
	return t, nil
}

// rewrite makes dir afresh (its parent, tree-<id>, removed first) and
// writes it; a failed write leaves nothing.
func rewrite(dir string, write func(dir string) error) error {
	work := filepath.Dir(dir)
	if err := os.RemoveAll(work); err != nil {
		return classified(ErrInfra, saying("workspace", err), err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		os.RemoveAll(work)
		return classified(ErrInfra, saying("workspace", err), err)
	}
	if err := write(dir); err != nil {
		os.RemoveAll(work)
		return err
	}
	return nil
}

// sweep removes every entry of workRoot, best effort.
func sweep(workRoot string) {
	entries, _ := os.ReadDir(workRoot)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(workRoot, e.Name()))
	}
}

// byDir is the checkout whose directory is dir.
func (ts *trees) byDir(dir string) (*tree, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, t := range ts.byID {
		if t.dir == dir {
			return t, true
		}
	}
	return nil, false
}

// unref ends one take of t that returned no checkout.
func (ts *trees) unref(t *tree) {
	ts.mu.Lock()
	t.refs--
	ts.mu.Unlock()
}

// give ends one take of t and removes the released checkouts beyond the
// keep most recently used (keep < 0: every released one). It returns the
// first error removing one.
func (ts *trees) give(t *tree, keep int) error {
	ts.mu.Lock()
	t.refs--
	ts.clock++
	t.used = ts.clock
	var idle []*tree
	for _, o := range ts.byID {
		if o.refs == 0 {
			idle = append(idle, o)
		}
	}
	slices.SortFunc(idle, func(a, b *tree) int { return cmp.Compare(b.used, a.used) })
	var drop []*tree
	if keep < 0 {
		keep = 0
	}
	if len(idle) > keep {
		drop = idle[keep:]
		for _, o := range drop {
			delete(ts.byID, o.id)
		}
	}
	ts.mu.Unlock()
	var first error
	for _, o := range drop {
		if err := os.RemoveAll(filepath.Dir(o.dir)); err != nil && first == nil {
			first = err
		}
	}
	return first
}
