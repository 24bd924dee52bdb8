package cascade

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/state"
)

// The agents' records (ADR 0201): every build agent keeps its last build of
// each module on its machine in its state (mesh.BuildRecord in
// build-agent.builds), which the controller's manifest reads. A controller
// that starts without an estimate of its own for a module — its store is
// new, or was lost — ranks that module's asks by the newest build any
// machine recorded of it instead of by none.

// recordsWait bounds reading the agents' records at start.
const recordsWait = 10 * time.Second

// seedEstimates gives each built module without an estimate the duration of
// its newest build an agent recorded. It reads the records through the
// controller module's own state surface, issued what its manifest declares:
// nothing when the manifest does not read build-agent.builds. A failure is
// logged; the controller starts all the same.
func (c *Controller) seedEstimates(ctx context.Context) {
	missing := false
	for _, m := range c.cat.Modules {
		if _, ok := c.lastBuild[m.Module]; !ok && m.Build != nil {
			missing = true
			break
		}
	}
	own, ok := c.cat.Module(c.module)
	if !missing || !ok {
		return
	}
	issued := c.cat.IssuedBuckets(own)
	ref := mesh.AgentBuildsRef()
	if !slices.ContainsFunc(issued, func(b mesh.IssuedBucket) bool { return b.Name == ref }) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, recordsWait)
	defer cancel()
	newest, err := readRecords(ctx, state.New(c.js, c.module, issued), ref)
	if err != nil {
		c.log.Warn("reading the agents' build records: asks of modules without an estimate are ranked without one", "bucket", ref, "err", err)
		return
	}
	var seeded []string
	for m, r := range newest {
		if _, ok := c.lastBuild[m]; !ok {
			c.lastBuild[m] = r.Duration
			seeded = append(seeded, m)
		}
	}
	if len(seeded) > 0 {
		slices.Sort(seeded)
		c.log.Info("estimates from the agents' build records", "modules", seeded)
	}
}

// readRecords returns, by module, the newest built record in the agents'
// bucket (named ref on st): its current values, up to the end-of-current
// marker.
func readRecords(ctx context.Context, st state.Surface, ref string) (map[string]mesh.BuildRecord, error) {
	w, err := st.Watch(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	newest := map[string]mesh.BuildRecord{}
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok || ev.Kind == state.Current {
				return newest, nil
			}
			var r mesh.BuildRecord
			if json.Unmarshal(ev.Value, &r) != nil || r.Module == "" || r.Outcome != mesh.EventBuilt || r.Duration <= 0 {
				continue
			}
			if r.At.After(newest[r.Module].At) {
				newest[r.Module] = r
			}
		case <-ctx.Done():
			return newest, ctx.Err()
		}
	}
}
