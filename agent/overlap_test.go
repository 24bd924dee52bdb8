package agent_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// stagedWorker works each ask in two stages that the test releases: its
// steps (then it calls agent.StepsDone), and its export (then it returns).
type stagedWorker struct {
	mu     sync.Mutex
	stages map[string][2]chan struct{}
	began  chan string
}

func newStaged() *stagedWorker {
	return &stagedWorker{stages: map[string][2]chan struct{}{}, began: make(chan string, 10)}
}

func (w *stagedWorker) stage(id string, n int) chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.stages[id]
	if !ok {
		s = [2]chan struct{}{make(chan struct{}), make(chan struct{})}
		w.stages[id] = s
	}
	return s[n]
}

func (w *stagedWorker) Work(ctx context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
	w.began <- a.ID
	for n := range 2 {
		select {
		case <-w.stage(a.ID, n):
		case <-ctx.Done():
			return agent.Result{}, fmt.Errorf("%w: %w", agent.ErrInfra, context.Cause(ctx))
		}
		if n == 0 {
			agent.StepsDone(ctx)
		}
	}
	return agent.Result{Digest: "sha256:" + fmt.Sprintf("%064x", len(a.ID)), Ref: a.Image + "@sha256:x"}, nil
}

// begins reports whether an ask begins within d, and which.
func (w *stagedWorker) begins(d time.Duration) (string, bool) {
	select {
	case id := <-w.began:
		return id, true
	case <-time.After(d):
		return "", false
	}
}

// A slot pulls its next ask once its build's own steps are done, and builds
// it beside the last one's export; it pulls a third only once the first has
// settled (two builds in hand at most, one of them past its steps). Without
// Overlap it pulls the next only once the build has settled.
func TestASlotPullsItsNextAskOnceItsBuildsStepsAreDone(t *testing.T) {
	for _, overlap := range []bool{true, false} {
		t.Run(fmt.Sprintf("overlap=%v", overlap), func(t *testing.T) {
			s, js := bus(t)
			w := newStaged()
			startAgent(t, s, "m1", w, func(c *agent.Config) { c.Overlap = overlap })
			for _, id := range []string{"a1", "a2", "a3"} {
				submit(t, js, ask(id))
			}
			first, ok := w.begins(5 * time.Second)
			if !ok {
				t.Fatal("no ask began")
			}
			if id, ok := w.begins(300 * time.Millisecond); ok {
				t.Fatalf("%s began beside %s, whose steps are not done", id, first)
			}
			close(w.stage(first, 0)) // first's steps done: it exports
			second, ok := w.begins(2 * time.Second)
			if overlap != ok {
				t.Fatalf("with overlap %v, after %s's steps: began %q (%v)", overlap, first, second, ok)
			}
			if !overlap {
				close(w.stage(first, 1))
				if second, ok = w.begins(5 * time.Second); !ok {
					t.Fatalf("nothing began after %s settled", first)
				}
			}
			close(w.stage(second, 0)) // second's steps done, first still exporting (overlap)
			if id, ok := w.begins(300 * time.Millisecond); ok && overlap {
				t.Fatalf("%s began while %s exports and %s's steps are done: three in hand", id, first, second)
			} else if ok {
				t.Fatalf("%s began while %s is in hand, without overlap", id, second)
			}
			if overlap {
				close(w.stage(first, 1)) // first settles: the slot pulls the third
			} else {
				close(w.stage(second, 1))
			}
			third, ok := w.begins(5 * time.Second)
			if !ok {
				t.Fatal("the third did not begin once the slot had one build in hand")
			}
			if overlap {
				close(w.stage(second, 1))
			}
			close(w.stage(third, 0))
			close(w.stage(third, 1))
			testenv.WaitFor(t, 10*time.Second, "three built", func() bool { return len(events(t, js).Built) == 3 })
			r := events(t, js)
			at := map[string]time.Time{}
			for _, b := range r.Built {
				at[b.Ask] = b.At
			}
			var secondStarted time.Time
			for _, st := range r.Started {
				if st.Ask == second {
					secondStarted = st.At
				}
			}
			if before := secondStarted.Before(at[first]); before != overlap {
				t.Errorf("with overlap %v: %s started at %s, %s built at %s", overlap, second, secondStarted, first, at[first])
			}
			drained(t, js, 5*time.Second)
		})
	}
}

// beganWorker builds every ask at once (no steps, no export of its own)
// and says which began.
type beganWorker struct{ began chan string }

func (w beganWorker) Work(_ context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
	w.began <- a.ID
	return agent.Result{Digest: "sha256:" + fmt.Sprintf("%064x", len(a.ID)), Ref: a.Image + "@sha256:x"}, nil
}

// heldEnd is an agent's observer whose first Ended waits for release: the
// first ask's settling (announced, acknowledged, counted) stands still
// until the test lets it end.
type heldEnd struct {
	once    sync.Once
	release chan struct{}
}

func (*heldEnd) IdleWaited(time.Duration) {}
func (*heldEnd) Began()                   {}
func (h *heldEnd) Ended(agent.End)        { h.once.Do(func() { <-h.release }) }

// A build that returns without an export of its own frees its slot when it
// returns: what is left, announcing and acknowledging it, is the bus's,
// and the slot pulls its next ask meanwhile (Overlap); it pulls a third only
// once the first has settled. Without Overlap the next waits for the
// first to settle.
func TestASlotPullsItsNextAskOnceItsBuildReturns(t *testing.T) {
	for _, overlap := range []bool{true, false} {
		t.Run(fmt.Sprintf("overlap=%v", overlap), func(t *testing.T) {
			s, js := bus(t)
			w := beganWorker{began: make(chan string, 10)}
			held := &heldEnd{release: make(chan struct{})}
			startObserved(t, s, "m1", w, func(c *agent.Config) { c.Overlap = overlap }, held)
			var released sync.Once
			let := func() { released.Do(func() { close(held.release) }) }
			t.Cleanup(let) // before the agent stops, should the test end early
			for _, id := range []string{"a1", "a2", "a3"} {
				submit(t, js, ask(id))
			}
			began := func(d time.Duration) (string, bool) {
				select {
				case id := <-w.began:
					return id, true
				case <-time.After(d):
					return "", false
				}
			}
			first, ok := began(5 * time.Second)
			if !ok {
				t.Fatal("no ask began")
			}
			second, ok := began(2 * time.Second)
			if ok != overlap {
				t.Fatalf("with overlap %v, while %s settles: began %q (%v)", overlap, first, second, ok)
			}
			if overlap {
				if id, ok := began(300 * time.Millisecond); ok {
					t.Fatalf("%s began while %s settles and %s is built: three in hand", id, first, second)
				}
			}
			let()
			for n := map[bool]int{true: 1, false: 2}[overlap]; n > 0; n-- {
				if _, ok := began(5 * time.Second); !ok {
					t.Fatalf("the rest did not begin once %s had settled", first)
				}
			}
			testenv.WaitFor(t, 10*time.Second, "three built", func() bool { return len(events(t, js).Built) == 3 })
			r := events(t, js)
			if len(r.Started) != 3 {
				t.Errorf("%d started for 3 asks", len(r.Started))
			}
			drained(t, js, 5*time.Second)
		})
	}
}

// With the real BuildKit, a build's steps are done when the daemon starts
// exporting its image: a slot builds its next ask beside an export that
// takes time (a layer of 64 MB that does not compress), and both images
// are built and pushed as they should be.
func TestTheNextBuildGoesOnBesideAnExport(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	base := busyboxBase(t, reg)
	git, commit := testenv.GitRepo(t, map[string]string{
		"big/Dockerfile":   "FROM busybox\nRUN head -c 64000000 /dev/urandom > /big\n",
		"small/Dockerfile": "FROM busybox\nRUN echo small > /small\n",
	})
	s, js := bus(t)
	startAgent(t, s, "m1", realWorker(t, bk, git), nil)
	submit(t, js, realAsk("big", commit, "big", reg+"/big", base))
	testenv.WaitFor(t, 60*time.Second, "big started", func() bool { return len(events(t, js).Started) == 1 })
	submit(t, js, realAsk("small", commit, "small", reg+"/small", base))
	testenv.WaitFor(t, 120*time.Second, "two built", func() bool { return len(events(t, js).Built) == 2 })
	r := events(t, js)
	var bigBuilt, smallStarted time.Time
	for _, b := range r.Built {
		if b.Ask == "big" {
			bigBuilt = b.At
		}
	}
	for _, st := range r.Started {
		if st.Ask == "small" {
			smallStarted = st.At
		}
	}
	if !smallStarted.Before(bigBuilt) {
		t.Fatalf("small started at %s, big built at %s: want small begun beside big's export", smallStarted.Format(time.StampMicro), bigBuilt.Format(time.StampMicro))
	}
	t.Logf("small began %s before big was built", bigBuilt.Sub(smallStarted))
	if len(r.Failed) != 0 {
		t.Fatalf("failed: %+v", r.Failed)
	}
	drained(t, js, 10*time.Second)
}
