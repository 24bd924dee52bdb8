package cascade

import (
	"context"
	"time"
)

// PlatformObserver is told, on every observation, how many asks wait for a
// platform no online holder builds, by platform (metrics). An Observer that
// implements it is told.
type PlatformObserver interface {
	AsksWithoutMachine(byPlatform map[string]int)
}

// platformWatch is what the controller saw of each platform's holders:
// when a holder of it last waited for an ask or held one.
type platformWatch struct {
	since time.Time
	seen  map[string]time.Time
	// holders is how many holders were waiting for or holding an ask,
	// over every platform, at the last look: the machines a plan's
	// forecast spreads its work over (0: none seen, the path alone).
	holders int
}

// servedWithin is how long a platform counts as served after a holder of
// it was last seen waiting or working: a holder between two pulls (or
// pulling another of its platforms) is not waiting at that instant.
func (c *Controller) servedWithin() time.Duration {
	return max(3*c.cfg.ObserveEvery, 15*time.Second)
}

// served reports whether a holder of the platform was seen lately; until
// the controller has watched for servedWithin, every platform is.
func (w platformWatch) served(platform string, now time.Time, within time.Duration) bool {
	if now.Sub(w.since) < within {
		return true
	}
	return now.Sub(w.seen[platform]) < within
}

// watchPlatforms reads each platform's holders' consumer — a holder
// waiting on it (NumWaiting) or holding an ask from it (NumAckPending) is a
// machine of the platform online — and notes, on every queued ask waiting
// for a platform with none, "no linux/arm64 machine online"
// (State.Unserved); an Observer that is a PlatformObserver counts them. It
// reports whether a note changed.
func (c *Controller) watchPlatforms(ctx context.Context) bool {
	now := time.Now()
	holders := 0
	for _, p := range c.catPlatforms {
		h, err := c.platformHolders(ctx, p)
		if err != nil {
			c.log.Warn("reading a platform's holders", "platform", p, "err", err)
			c.platforms.seen[p] = now // unknown is not absent
			continue
		}
		if h.Waiting > 0 || h.AckPending > 0 {
			c.platforms.seen[p] = now
		}
		holders += h.Waiting + h.AckPending
		c.adviseShards(p, h.Waiting+h.AckPending)
	}
	c.platforms.holders = holders
	within := c.servedWithin()
	byPlatform := map[string]int{}
	changed := false
	for _, st := range c.plans {
		mods, _ := st.Unserved(func(p string) bool {
			if c.platforms.served(p, now, within) {
				return true
			}
			byPlatform[p]++
			return false
		})
		if len(mods) > 0 {
			c.touch(st, mods...)
			changed = true
		}
	}
	if po, ok := c.obs.(PlatformObserver); ok {
		po.AsksWithoutMachine(byPlatform)
	}
	return changed
}
