package planview_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/cmd/internal/planview"
)

func store(t *testing.T) *cascade.Store {
	t.Helper()
	_, st := cascadetest.PlanStore(t)
	return st
}

// Watch follows a plan made after it started, through every change, and
// returns only once the record is settled and every module has arrived
// finished: a settled record written before its modules does not end it.
func TestWatchFollowsAPlanToSettled(t *testing.T) {
	st := store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	running := cascade.PlanRecord{ID: "p1", Outcome: cascade.OutcomeRunning, Counts: cascade.Counts{Queued: 1, Waiting: 1, Total: 2}}
	settled := cascade.PlanRecord{ID: "p1", Outcome: cascade.OutcomeBuilt, Counts: cascade.Counts{Built: 2, Total: 2}}
	steps := []map[string]any{
		{cascade.PlanKey("p1"): running},
		{cascade.ModuleKey("p1", "a"): cascade.ModuleStatus{Module: "a", State: cascade.Queued}},
		{cascade.ModuleKey("p1", "a"): cascade.ModuleStatus{Module: "a", State: cascade.Built, On: "m1"}},
		{cascade.PlanKey("p1"): settled},
		{cascade.ModuleKey("p1", "b"): cascade.ModuleStatus{Module: "b", State: cascade.Built, On: "m2"}},
	}
	step := make(chan struct{})
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for _, values := range steps {
			select {
			case <-step:
			case <-ctx.Done():
				return
			}
			if err := st.Put(ctx, values); err != nil {
				t.Error(err)
			}
		}
	}()
	var seen []string
	step <- struct{}{} // the record, after the watch started or not: either way it is seen
	p, err := planview.Watch(ctx, st, "p1", planview.Options{
		Changed: func(p planview.Plan, m *cascade.ModuleStatus, was cascade.ModuleState) {
			if m == nil {
				seen = append(seen, "record "+string(p.Record.Outcome))
			} else {
				seen = append(seen, m.Module+" "+string(was)+"→"+string(m.State))
			}
			if len(seen) < len(steps) {
				step <- struct{}{}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	<-wrote // the last write's answer may come after the watch saw it
	want := []string{"record running", "a →queued", "a queued→built", "record built", "b →built"}
	if len(seen) != len(want) {
		t.Fatalf("changes %q, want %q", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("changes %q, want %q", seen, want)
		}
	}
	if !p.Settled() || p.Record.Outcome != cascade.OutcomeBuilt || p.Modules["b"].On != "m2" {
		t.Errorf("Watch = %+v, want the plan settled with both modules", p)
	}
}

// A plan never made is ErrNoPlan after Appear; a cancelled ctx ends the
// watch with its cause.
func TestWatchEnds(t *testing.T) {
	st := store(t)
	_, err := planview.Watch(context.Background(), st, "nope", planview.Options{Appear: 300 * time.Millisecond})
	if !errors.Is(err, cascade.ErrNoPlan) {
		t.Errorf("Watch of a plan never made: %v, want ErrNoPlan", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	why := errors.New("the farm failed")
	_, err = planview.Watch(ctx, st, "nope", planview.Options{Ticked: func(planview.Plan) { cancel(why) }, Tick: 10 * time.Millisecond})
	if !errors.Is(err, why) {
		t.Errorf("Watch with its ctx cancelled: %v, want the cause", err)
	}
}

// A plan whose push the controller fetches first (cascade.Fetching in the
// store) is waited for past Appear, said once; the record made, it is
// followed to settled. A record of a fetch too old (a controller stopped
// mid-fetch) is not.
func TestWatchWaitsForAPushWhoseCommitIsFetched(t *testing.T) {
	st := store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := cascade.Fetching{Repo: "https://git.example/big.git", Commit: "0123456789abcdef0123456789abcdef01234567", Since: time.Now().UTC()}
	if err := st.MarkFetching(ctx, "p2", f); err != nil {
		t.Fatal(err)
	}
	const appear = 200 * time.Millisecond
	controller := make(chan struct{})
	go func() {
		defer close(controller)
		time.Sleep(5 * appear)
		settled := cascade.PlanRecord{ID: "p2", Outcome: cascade.OutcomeBuilt, Counts: cascade.Counts{Built: 1, Total: 1}}
		if err := st.Put(ctx, map[string]any{cascade.PlanKey("p2"): settled, cascade.ModuleKey("p2", "a"): cascade.ModuleStatus{Module: "a", State: cascade.Built}}); err != nil {
			t.Error(err)
		}
		if err := st.Fetched(ctx, "p2"); err != nil {
			t.Error(err)
		}
	}()
	var said []cascade.Fetching
	p, err := planview.Watch(ctx, st, "p2", planview.Options{Appear: appear, Fetching: func(f cascade.Fetching) { said = append(said, f) }})
	if err != nil || !p.Settled() {
		t.Fatalf("Watch of a plan whose commit is fetched: %+v, %v; want it waited for and settled", p, err)
	}
	if len(said) != 1 || said[0].Commit != f.Commit {
		t.Errorf("said %+v, want the fetch once", said)
	}
	<-controller // it removes the record once the plan is made, as the controller does
	if _, ok, err := st.FetchingFor(ctx, "p2"); ok || err != nil {
		t.Errorf("the record of the fetch is still there (%v)", err)
	}

	old := f
	old.Since = time.Now().Add(-cascade.PrefetchTimeout - 2*time.Minute)
	if err := st.MarkFetching(ctx, "p3", old); err != nil {
		t.Fatal(err)
	}
	if _, err := planview.Watch(ctx, st, "p3", planview.Options{Appear: appear}); !errors.Is(err, cascade.ErrNoPlan) {
		t.Errorf("Watch with a stale record of a fetch: %v, want ErrNoPlan", err)
	}
}
