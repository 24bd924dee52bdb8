package deploy

import (
	"context"
	"sort"
	"time"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/mesh"
)

// SeatView is a seat as `builds seats` shows it: who is assigned to hold it
// at its scope, and its work queue.
type SeatView struct {
	Seat  string `json:"seat"`
	Scope string `json:"scope"`
	// Modules are the catalogue's modules that hold the seat.
	Modules []string `json:"modules"`
	// Holders are the nodes a holding module is assigned to: one in the
	// mesh for a mesh-scoped seat, one per node for a node-scoped one.
	Holders []Holder `json:"holders"`
	// Queued is how many accepted asks wait in the seat's work queue, not
	// yet taken;
	// InFlight how many a holder has taken and not settled; Waiting how
	// many holders wait for work.
	// Claims are who holds the seat now, by their claims in KV (package
	// claim): the process, since when, at which scope.
	Claims   []claim.Record `json:"claims"`
	Queued   uint64         `json:"queued"`
	InFlight int            `json:"in_flight"`
	Waiting  int            `json:"waiting"`
	Accepts  bool           `json:"accepts"`
}

// Holder is one node holding a seat, through a module, since its assignment.
type Holder struct {
	Node   string    `json:"node"`
	Module string    `json:"module"`
	Since  time.Time `json:"since"`
	Online bool      `json:"online"`
}

// seats is every seat of the catalogue with its assigned holders and queue.
func (c *Controller) seats(ctx context.Context) []SeatView {
	now := time.Now()
	out := []SeatView{}
	for _, s := range c.cat.Seats() {
		v := SeatView{Seat: s.Seat, Scope: s.Scope, Modules: []string{}, Holders: []Holder{}, Accepts: len(s.Accepts) > 0}
		for _, m := range c.cat.Holders(s.Seat) {
			v.Modules = append(v.Modules, m.Module)
			a := c.assign[m.Module]
			for _, n := range a.Nodes {
				h := c.heard[n]
				v.Holders = append(v.Holders, Holder{Node: n, Module: m.Module, Since: a.Updated,
					Online: !h.At.IsZero() && now.Sub(h.At) < c.cfg.OnlineWithin})
			}
		}
		sort.Slice(v.Holders, func(i, j int) bool { return v.Holders[i].Node < v.Holders[j].Node })
		v.Claims = []claim.Record{}
		if recs, err := claim.List(ctx, c.js, s.Seat); err == nil {
			v.Claims = append(v.Claims, recs...)
		} else {
			c.log.Warn("reading the seat's claims", "seat", s.Seat, "err", err)
		}
		if v.Accepts {
			if st, err := c.js.Stream(ctx, mesh.SeatStream(s.Seat)); err == nil {
				if info, err := st.Info(ctx); err == nil {
					v.Queued = info.State.Msgs
				}
			}
			// The holders' consumers: one, or one per platform.
			for _, name := range c.cat.HolderConsumers(s) {
				cons, err := c.js.Consumer(ctx, mesh.SeatStream(s.Seat), name)
				if err != nil {
					continue
				}
				if info, err := cons.Info(ctx); err == nil {
					v.InFlight += info.NumAckPending
					v.Waiting += info.NumWaiting
					v.Queued -= min(v.Queued, uint64(info.NumAckPending))
				}
			}
		}
		out = append(out, v)
	}
	return out
}
