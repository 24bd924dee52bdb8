// Package backoff is the one exponential backoff of meshbuild: a first
// delay, doubled on every further attempt up to a bound, and a retry loop
// that waits it out between attempts.
//
// A holder waiting for its queue to be raised, an event retried until the
// server takes it, and an ask given back after an infrastructure failure
// all wait this way:
//
//	p := backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second}
//	p.Delay(1) // 250ms
//	p.Delay(3) // 1s
//	p.Delay(9) // 5s, and so on
package backoff

import (
	"context"
	"time"
)

// Policy is an exponential backoff: First before the first retry, doubled
// for each one after, never more than Max. A Max below First is taken as
// First.
type Policy struct {
	First, Max time.Duration
}

// Delay is the wait before retry n, counted from 1: First, 2×First,
// 4×First, … up to Max. An n below 1 is taken as 1.
func (p Policy) Delay(n int) time.Duration {
	limit := max(p.First, p.Max)
	d := p.First
	for i := 1; i < n && d < limit; i++ {
		if d > limit/2 { // doubling would pass the bound (or overflow)
			return limit
		}
		d *= 2
	}
	return min(d, limit)
}

// Retry calls try until it returns nil, it returns an error retryable
// refuses (nil retries every error), attempts calls were made (0: no
// bound) or ctx is done, waiting Delay(n) after the nth failed call. It
// returns nil, try's last error, or ctx's error when ctx ended the wait.
func (p Policy) Retry(ctx context.Context, attempts int, retryable func(error) bool, try func() error) error {
	for n := 1; ; n++ {
		err := try()
		if err == nil || (retryable != nil && !retryable(err)) || (attempts > 0 && n >= attempts) {
			return err
		}
		if werr := Wait(ctx, p.Delay(n)); werr != nil {
			return werr
		}
	}
}

// Wait waits d, or until ctx is done: then it returns ctx's error.
func Wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
