package cascade

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/seat"
)

// # A push's commit is fetched beside the loop
//
// A plan's modules are addressed (address: their build contexts' tree ids,
// for their input keys) from the controller's clones, which a push's
// commit must first be fetched into. A fetch takes as long as the git
// server and the repository make it — seconds for a big one — and the
// controller's loop does nothing else meanwhile: no other plan's events,
// no tools. So a push whose commit a clone lacks is set aside, unacked,
// and its commit fetched by a goroutine of its own; the loop goes on, and
// plans the push when the fetch is done (fetched), the commit then in the
// clone. The pushes of a repository are planned in the order they came:
// one that comes while an earlier push of its repository is set aside
// waits behind it. A fetch that fails leaves the push planned as before
// a failed resolve did: its modules unaddressed, dispatched. A controller
// that stops meanwhile leaves the pushes set aside unacked, for the next.
//
// The modules of other repositories in a push's plan (built on a changed
// module) are built at their current commit: their repository's HEAD, which
// only its git server knows. Those are fetched beside the loop too, with
// the push's commit, all at once; the plan is then addressed with the
// HEADs they fetched (heads), without asking the servers again.

// PrefetchTimeout bounds a push's fetch beside the loop. It holds nothing
// else up, so it may take long: a first fetch of a big repository.
const PrefetchTimeout = 10 * time.Minute

// prefetchProgress is how often a push set aside is said to be in
// progress, so that the bus does not deliver it again meanwhile.
const prefetchProgress = 5 * time.Second

// prefetched is a fetch beside the loop, done: for the push of repo at
// commit, the HEAD each other repository's fetch found, and the sources
// whose fetch failed.
type prefetched struct {
	repo, commit string
	heads        map[string]string
	failed       map[fetchSource]error
	// rebuild, when set, is the rebuild request whose modules' HEADs
	// were fetched (rebuildAside), answered once its plan is made.
	rebuild *seat.Letter[command, Reply]
}

// fetchSource is a repository and a commit of it; an empty commit is the
// repository's HEAD.
type fetchSource struct{ repo, commit string }

// setAside reports whether push m (planned as p) waits for a fetch: behind
// an earlier push of its repository, or for what its plan needs from git
// servers — its own commit, the other repositories' HEADs — whose fetch it
// starts. A source whose fetch failed, or fetched just now, is not fetched
// again here.
func (c *Controller) setAside(ctx context.Context, m jetstream.Msg, p planner.Plan) bool {
	if c.trees == nil {
		return false
	}
	repo := p.Trigger.Repo
	var src fetchSource
	for _, n := range p.Modules {
		// A module of the pushed repository carries the push's commit
		// (its repository as its manifest spells it, which address
		// fetches).
		if n.Source.Commit != "" && n.Source.Commit == p.Trigger.Commit {
			src = fetchSource{n.Source.Repo, n.Source.Commit}
			repo = n.Source.Repo
			break
		}
	}
	mark := func(f fetchSource) {
		// Said in the store, for whoever watches the plan meanwhile;
		// removed when the push is planned (afterFetch).
		if err := c.store.MarkFetching(ctx, p.ID, Fetching{Repo: f.repo, Commit: f.commit, Since: time.Now().UTC()}); err != nil {
			c.log.Warn("could not record the push's fetch", "plan", p.ID, "err", err)
		}
	}
	if q, ok := c.fetching[repo]; ok {
		c.fetching[repo] = append(q, m)
		mark(cmp.Or(src, fetchSource{repo: repo}))
		return true
	}
	var need []fetchSource
	if _, failed := c.fetchFailed[src]; src.repo != "" && !failed && src != c.fetchedNow && gitcache.FullHash(src.commit) && !c.trees.Has(ctx, src.repo, src.commit) {
		need = append(need, src)
	}
	heads := map[string]bool{}
	for _, n := range p.Modules {
		head := fetchSource{repo: n.Source.Repo}
		if n.Source.Commit != "" || heads[head.repo] {
			continue
		}
		heads[head.repo] = true
		if _, fetched := c.heads[head.repo]; fetched {
			continue
		}
		if _, failed := c.fetchFailed[head]; !failed {
			need = append(need, head)
		}
	}
	if len(need) == 0 {
		return false // all there (or tried just now): nothing to fetch
	}
	if c.fetching == nil {
		c.fetching = map[string][]jetstream.Msg{}
	}
	c.fetching[repo] = []jetstream.Msg{m}
	c.log.Info("fetching what a push's plan needs beside the loop; the push is planned when it is done",
		"repo", repo, "commit", src.commit, "sources", len(need), "plan", p.ID)
	mark(need[0])
	go c.prefetch(ctx, fetchSource{repo, src.commit}, need, m)
	return true
}

// prefetch fetches each of srcs into its clone, prefetchParallel at a
// time, and says so on c.fetched (for the push of push, m), saying m in
// progress meanwhile.
func (c *Controller) prefetch(ctx context.Context, push fetchSource, srcs []fetchSource, m jetstream.Msg) {
	fctx, cancel := context.WithTimeout(ctx, PrefetchTimeout)
	defer cancel()
	d := prefetched{repo: push.repo, commit: push.commit, heads: map[string]string{}, failed: map[fetchSource]error{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.fetchSources(fctx, &d, srcs)
	}()
	tick := time.NewTicker(prefetchProgress)
	defer tick.Stop()
	for {
		select {
		case <-done:
			select {
			case c.fetched <- d:
			case <-ctx.Done():
			}
			return
		case <-tick.C:
			_ = m.InProgress()
		}
	}
}

// fetchSources fetches each of srcs into its clone, prefetchParallel at a
// time, and records in d the HEADs found and the fetches that failed.
func (c *Controller) fetchSources(ctx context.Context, d *prefetched, srcs []fetchSource) {
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(prefetchParallel)
	for _, src := range srcs {
		g.Go(func() error {
			_, full, err := c.trees.Fetch(ctx, src.repo, cmp.Or(src.commit, "HEAD"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				d.failed[src] = err
			case src.commit == "":
				d.heads[src.repo] = full
			}
			return nil
		})
	}
	_ = g.Wait()
}

// # A rebuild's HEADs are fetched beside the loop too
//
// A rebuild builds its modules at their repositories' HEADs, which only
// their git servers know: asked in the loop (address), a slow server held
// every other plan's events and every tool for as long as it took (up to
// Config.ResolveTimeout). So a rebuild whose plan is not made yet has its
// HEADs fetched by a goroutine of its own, bounded by ResolveTimeout as
// before, and is planned and answered when they are (afterFetch): the
// plan addressed with the HEADs fetched, a HEAD whose fetch failed leaving
// its modules unaddressed, dispatched, as a failed resolve did.

// rebuildAside reports whether tool request cmd is a rebuild that waits
// for its modules' HEADs, whose fetch it starts; it is answered when they
// are fetched.
func (c *Controller) rebuildAside(ctx context.Context, cmd seat.Letter[command, Reply]) bool {
	if c.trees == nil || cmd.Q.Kind != ToolRebuild || cmd.Q.Req.ID == "" || len(cmd.Q.Req.Modules) == 0 {
		return false
	}
	p, err := c.ix.Plan(rebuildTrigger(cmd.Q.Req))
	if err != nil {
		return false // refused as it is answered
	}
	if _, ok := c.plans[p.ID]; ok {
		return false
	}
	var need []fetchSource
	heads := map[string]bool{}
	for _, n := range p.Modules {
		if n.Source.Commit != "" || heads[n.Source.Repo] {
			continue
		}
		heads[n.Source.Repo] = true
		need = append(need, fetchSource{repo: n.Source.Repo})
	}
	if len(need) == 0 {
		return false
	}
	c.log.Info("fetching the HEADs a rebuild's plan needs beside the loop; it is planned when they are fetched",
		"request", cmd.Q.Req.ID, "sources", len(need), "plan", p.ID)
	go func() {
		fctx, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
		defer cancel()
		d := prefetched{heads: map[string]string{}, failed: map[fetchSource]error{}, rebuild: &cmd}
		c.fetchSources(fctx, &d, need)
		select {
		case c.fetched <- d:
		case <-ctx.Done():
			cmd.Answer(Reply{Error: "the controller stopped before the rebuild was planned: ask again"})
		}
	}()
	return true
}

// rebuildTrigger is the trigger of a rebuild request.
func rebuildTrigger(req Request) planner.Trigger {
	return planner.Trigger{Kind: planner.KindRebuild, ID: req.ID, Modules: req.Modules, Force: req.Force}
}

// prefetchParallel is how many sources prefetch fetches at once.
const prefetchParallel = 8

// pushPlanID is the plan push m makes.
func (c *Controller) pushPlanID(m jetstream.Msg) (string, bool) {
	ev, err := mesh.DecodeEvent[mesh.Pushed](m.Data())
	if err != nil {
		return "", false
	}
	p, err := c.ix.Plan(planner.Trigger{Kind: planner.KindPush, Repo: ev.Repo, Commit: ev.Commit, Ref: ev.Ref, Paths: ev.Paths})
	if err != nil {
		return "", false
	}
	return p.ID, true
}

// afterFetch plans the pushes that waited for d's fetch, in order, until
// one waits for a fetch of its own (the rest wait behind it); it returns
// those to acknowledge once the batch is stored.
func (c *Controller) afterFetch(ctx context.Context, d prefetched) []jetstream.Msg {
	for f, err := range d.failed {
		if c.fetchFailed == nil {
			c.fetchFailed = map[fetchSource]error{}
		}
		c.fetchFailed[f] = err
		defer delete(c.fetchFailed, f)
	}
	if d.rebuild != nil {
		c.heads = d.heads
		defer func() { c.heads = nil }()
		d.rebuild.Answer(c.command(ctx, d.rebuild.Q))
		return nil
	}
	q := c.fetching[d.repo]
	delete(c.fetching, d.repo)
	src := fetchSource{d.repo, d.commit}
	c.fetchedNow, c.heads = src, d.heads
	defer func() { c.fetchedNow, c.heads = fetchSource{}, nil }()
	var kept []jetstream.Msg
	for i, m := range q {
		if !c.pushed(ctx, m, time.Now().UTC()) {
			kept = append(kept, m)
		}
		if id, ok := c.pushPlanID(m); ok {
			if _, waiting := c.fetching[d.repo]; !waiting || !slices.Contains(c.fetching[d.repo], m) {
				if err := c.store.Fetched(ctx, id); err != nil {
					c.log.Warn("could not remove the record of the push's fetch", "plan", id, "err", err)
				}
			}
		}
		if _, again := c.fetching[d.repo]; again {
			c.fetching[d.repo] = append(c.fetching[d.repo], q[i+1:]...)
			break
		}
	}
	return kept
}
