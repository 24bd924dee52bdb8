package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Group is a replicated stream (Consumer empty) or a consumer of one: a
// raft group with a leader on one of the cluster's servers.
type Group struct {
	Stream, Consumer string
}

func (g Group) String() string {
	if g.Consumer == "" {
		return g.Stream
	}
	return g.Stream + "/" + g.Consumer
}

// leadWait bounds how long LeadHere works on one group when its context
// has no deadline; electionWait how long it waits for the election a
// stepdown starts before it asks again.
const (
	leadWait     = 3 * time.Second
	electionWait = time.Second
)

// groupWait is how long LeadHere gives the next of left groups: an equal
// share of what is left of ctx's time, so that a group that moved quickly
// leaves its time to those after it and one that does not move leaves
// theirs to them; leadWait without a deadline.
func groupWait(ctx context.Context, left int) time.Duration {
	deadline, ok := ctx.Deadline()
	if !ok {
		return leadWait
	}
	return time.Until(deadline) / time.Duration(left)
}

// LeadHere asks the leader of each group that is not on the server nc is
// connected to to hand over to that server (a leader stepdown with that
// server preferred, nats-server 2.11+), and waits for each to. On a
// cluster, what a client writes to a stream goes to the stream's leader,
// and what a consumer delivers comes from the consumer's: from a client on
// another server, each write is forwarded to the leader over a route and
// its answer comes back the same way, and each delivery and
// acknowledgement crosses a route too. A client that writes on every
// step (the controller: its plans, its asks, its events consumer) has them
// on its own server instead. Nothing depends on it: a leader that moves
// later (a server restarted, the client reconnected elsewhere) costs the
// hops again, not a write. A group of one replica, or whose leader is here
// already, is left as it is. It returns the groups it moved and an error
// joining every group it could not (an old server, no quorum, no grant):
// each is still served where its leader is. Each group has an equal share
// of what is left of ctx's time (groupWait).
func LeadHere(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, groups []Group) (moved []Group, err error) {
	here := nc.ConnectedServerName()
	if here == "" {
		return nil, errors.New("not connected")
	}
	var errs []error
	for i, g := range groups {
		ok, err := leadHere(ctx, nc, js, g, here, groupWait(ctx, len(groups)-i))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", g, err))
		}
		if ok {
			moved = append(moved, g)
		}
	}
	return moved, errors.Join(errs...)
}

// LeaderOf is the name of the server leading g, and whether g is
// replicated at all (on one server, or at one replica, it is not, and has
// no leader to move).
func LeaderOf(ctx context.Context, js jetstream.JetStream, g Group) (name string, replicated bool, err error) {
	var ci *jetstream.ClusterInfo
	if g.Consumer == "" {
		st, err := js.Stream(ctx, g.Stream)
		if err != nil {
			return "", false, err
		}
		ci = st.CachedInfo().Cluster
	} else {
		c, err := js.Consumer(ctx, g.Stream, g.Consumer)
		if err != nil {
			return "", false, err
		}
		ci = c.CachedInfo().Cluster
	}
	if ci == nil || len(ci.Replicas) == 0 {
		return "", false, nil
	}
	return ci.Leader, true, nil
}

// leaderNow is LeaderOf during an election: the group's leader answers the
// info request, and one asked of the leader that steps down, or before
// another is elected, is answered by nobody; it is given up after
// electionWait, and the caller asks again, where LeaderOf would wait out
// ctx (CI: a consumer's info asked as its leader moved held a LeadHere for
// all of its 3 s).
func leaderNow(ctx context.Context, js jetstream.JetStream, g Group) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, electionWait)
	defer cancel()
	return LeaderOf(ctx, js, g)
}

func leadHere(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, g Group, here string, wait time.Duration) (bool, error) {
	lead, replicated, err := LeaderOf(ctx, js, g)
	if err != nil || !replicated || lead == here {
		return false, err
	}
	subject := StreamLeaderStepdown(g.Stream)
	if g.Consumer != "" {
		subject = ConsumerLeaderStepdown(g.Stream, g.Consumer)
	}
	body, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": here}})
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	// The leader hands over to the server preferred only if it heard from
	// it lately, else to whichever follower wins the election: asked
	// again until it is here.
	for {
		// A group between leaders answers nobody: each ask is bounded,
		// and the leader looked at again.
		rctx, rcancel := context.WithTimeout(ctx, electionWait)
		m, err := nc.RequestWithContext(rctx, subject, body)
		rcancel()
		if err != nil {
			if ctx.Err() != nil {
				return false, fmt.Errorf("its leader is %s: %w", lead, err)
			}
			if l, _, lerr := leaderNow(ctx, js, g); lerr == nil && l != "" {
				if lead = l; lead == here {
					return true, nil
				}
			}
			continue
		}
		var resp struct {
			Error *jetstream.APIError `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			return false, fmt.Errorf("reading the answer to a leader stepdown: %w", err)
		}
		if resp.Error != nil {
			// Refused because it is here already: the last ask's
			// election came to pass after the look that missed it.
			if l, _, err := leaderNow(ctx, js, g); err == nil && l == here {
				return true, nil
			}
			return false, fmt.Errorf("its leader is %s: %w", lead, resp.Error)
		}
		// The election follows the answer; one that does not come to
		// pass (the old leader elected again, none at all) is asked for
		// again after electionWait.
		was, asked := lead, time.Now()
		for (lead == was || lead == "") && time.Since(asked) < electionWait {
			select {
			case <-ctx.Done():
				return false, fmt.Errorf("its leader is %s after %s", lead, wait.Round(time.Millisecond))
			case <-time.After(25 * time.Millisecond):
			}
			if l, _, err := leaderNow(ctx, js, g); err == nil {
				lead = l
			}
		}
		if lead == here {
			return true, nil
		}
	}
}
