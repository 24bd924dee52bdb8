package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDelayDoublesUpToItsBound(t *testing.T) {
	p := Policy{First: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 100, 100, 200, 400, 800, 1000, 1000}
	for i, n := range []int{-1, 0, 1, 2, 3, 4, 5, 50} {
		if got := p.Delay(n); got != want[i]*time.Millisecond {
			t.Errorf("Delay(%d) = %s, want %s", n, got, want[i]*time.Millisecond)
		}
	}
	if got := (Policy{First: time.Second}).Delay(5); got != time.Second {
		t.Errorf("no Max: Delay(5) = %s, want First", got)
	}
	// A bound near the largest duration does not overflow.
	big := Policy{First: time.Hour, Max: 1<<63 - 1}
	for n := 1; n < 200; n++ {
		if d := big.Delay(n); d < time.Hour {
			t.Fatalf("Delay(%d) = %s: overflowed", n, d)
		}
	}
}

func TestRetryStopsOnSuccessBoundRefusalOrContext(t *testing.T) {
	p := Policy{First: time.Millisecond, Max: 2 * time.Millisecond}
	ctx := context.Background()
	boom := errors.New("boom")

	calls := 0
	if err := p.Retry(ctx, 0, nil, func() error {
		calls++
		if calls < 3 {
			return boom
		}
		return nil
	}); err != nil || calls != 3 {
		t.Errorf("success on the third call: %v after %d calls", err, calls)
	}

	calls = 0
	if err := p.Retry(ctx, 4, nil, func() error { calls++; return boom }); !errors.Is(err, boom) || calls != 4 {
		t.Errorf("bounded: %v after %d calls, want boom after 4", err, calls)
	}

	permanent := errors.New("permanent")
	calls = 0
	if err := p.Retry(ctx, 0, func(err error) bool { return !errors.Is(err, permanent) }, func() error {
		calls++
		return permanent
	}); !errors.Is(err, permanent) || calls != 1 {
		t.Errorf("refused: %v after %d calls, want permanent after 1", err, calls)
	}

	cctx, cancel := context.WithCancel(ctx)
	calls = 0
	err := Policy{First: time.Hour}.Retry(cctx, 0, nil, func() error { calls++; cancel(); return boom })
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Errorf("cancelled: %v after %d calls, want context.Canceled after 1", err, calls)
	}
}
