// Package backoff is the one delay policy of the daemons' retry loops:
// exponential from Base, capped at Max, with full jitter in the upper half
// so that many retrying processes do not retry in step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy is an exponential backoff: attempt 0 waits about Base, each next
// attempt twice as long, never more than Max. A zero Base is 100 ms; a zero
// Max is 10 s.
type Policy struct {
	Base time.Duration
	Max  time.Duration
}

// Defaults of a zero Policy.
const (
	DefaultBase = 100 * time.Millisecond
	DefaultMax  = 10 * time.Second
)

func (p Policy) withDefaults() Policy {
	if p.Base <= 0 {
		p.Base = DefaultBase
	}
	if p.Max <= 0 {
		p.Max = DefaultMax
	}
	p.Max = max(p.Max, p.Base)
	return p
}

// Delay is how long to wait before retry number attempt (0 for the first
// retry): a uniformly random duration in [d/2, d], where d is Base·2^attempt
// capped at Max.
func (p Policy) Delay(attempt int) time.Duration {
	p = p.withDefaults()
	d := p.Max
	if attempt < 62 {
		if s := p.Base << max(0, attempt); s > 0 && s < p.Max {
			d = s
		}
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Sleep waits Delay(attempt), or until ctx is done, whose error it returns.
func (p Policy) Sleep(ctx context.Context, attempt int) error {
	t := time.NewTimer(p.Delay(attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
