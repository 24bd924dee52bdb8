package cascade

import (
	"context"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
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

// PrefetchTimeout bounds a push's fetch beside the loop. It holds nothing
// else up, so it may take long: a first fetch of a big repository.
const PrefetchTimeout = 10 * time.Minute

// prefetchProgress is how often a push set aside is said to be in
// progress, so that the bus does not deliver it again meanwhile.
const prefetchProgress = 5 * time.Second

// prefetched is a fetch beside the loop, done.
type prefetched struct {
	repo, commit string
	err          error
}

// fetchSource is a repository and a commit of it.
type fetchSource struct{ repo, commit string }

// setAside reports whether push m (planned as p) waits for a fetch: behind
// an earlier push of its repository, or for its own commit, whose fetch it
// starts. A commit whose fetch failed is not fetched again here.
func (c *Controller) setAside(ctx context.Context, m jetstream.Msg, p planner.Plan) bool {
	if c.trees == nil {
		return false
	}
	var src fetchSource
	for _, n := range p.Modules {
		// A module of the pushed repository carries the push's commit
		// (its repository as its manifest spells it, which address
		// fetches).
		if n.Source.Commit != "" && n.Source.Commit == p.Trigger.Commit {
			src = fetchSource{n.Source.Repo, n.Source.Commit}
			break
		}
	}
	if src.repo == "" {
		return false // no module of the push's repository: nothing to fetch
	}
	mark := func() {
		// Said in the store, for whoever watches the plan meanwhile;
		// removed when the push is planned (afterFetch).
		if err := c.store.MarkFetching(ctx, p.ID, Fetching{Repo: src.repo, Commit: src.commit, Since: time.Now().UTC()}); err != nil {
			c.log.Warn("could not record the push's fetch", "plan", p.ID, "err", err)
		}
	}
	if q, ok := c.fetching[src.repo]; ok {
		c.fetching[src.repo] = append(q, m)
		mark()
		return true
	}
	if _, failed := c.fetchFailed[src]; failed || src == c.fetchedNow || !gitcache.FullHash(src.commit) || c.trees.Has(ctx, src.repo, src.commit) {
		return false // fetched (or tried) just now, or nothing to fetch
	}
	if c.fetching == nil {
		c.fetching = map[string][]jetstream.Msg{}
	}
	c.fetching[src.repo] = []jetstream.Msg{m}
	c.log.Info("fetching a push's commit beside the loop; the push is planned when it is done", "repo", src.repo, "commit", src.commit, "plan", p.ID)
	mark()
	go c.prefetch(ctx, src, m)
	return true
}

// prefetch fetches src's commit into its clone and says so on c.fetched,
// saying m in progress meanwhile.
func (c *Controller) prefetch(ctx context.Context, src fetchSource, m jetstream.Msg) {
	fctx, cancel := context.WithTimeout(ctx, PrefetchTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := c.trees.Fetch(fctx, src.repo, src.commit)
		done <- err
	}()
	tick := time.NewTicker(prefetchProgress)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			select {
			case c.fetched <- prefetched{repo: src.repo, commit: src.commit, err: err}:
			case <-ctx.Done():
			}
			return
		case <-tick.C:
			_ = m.InProgress()
		}
	}
}

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
	src := fetchSource{d.repo, d.commit}
	if d.err != nil {
		if c.fetchFailed == nil {
			c.fetchFailed = map[fetchSource]error{}
		}
		c.fetchFailed[src] = d.err
		defer delete(c.fetchFailed, src)
	}
	q := c.fetching[d.repo]
	delete(c.fetching, d.repo)
	c.fetchedNow = src
	defer func() { c.fetchedNow = fetchSource{} }()
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
