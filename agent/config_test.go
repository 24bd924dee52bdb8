package agent

import (
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// The delay before an infrastructure retry starts at RetryDelay, doubles,
// and stops at MaxRetryDelay: it is never zero and never constant.
func TestRetryDelayGrowsToItsBound(t *testing.T) {
	c := DefaultConfig()
	if got := c.retryDelay(1); got != c.RetryDelay {
		t.Fatalf("after attempt 1: %s, want RetryDelay %s", got, c.RetryDelay)
	}
	prev := time.Duration(0)
	reached := false
	for n := 1; n <= 40; n++ {
		d := c.retryDelay(n)
		switch {
		case d <= 0:
			t.Fatalf("after attempt %d: %s, want a delay", n, d)
		case d > c.MaxRetryDelay:
			t.Fatalf("after attempt %d: %s, more than MaxRetryDelay %s", n, d, c.MaxRetryDelay)
		case !reached && d != min(2*prev, c.MaxRetryDelay) && n > 1:
			t.Fatalf("after attempt %d: %s, want double %s (at most %s)", n, d, prev, c.MaxRetryDelay)
		case reached && d != c.MaxRetryDelay:
			t.Fatalf("after attempt %d: %s, want to stay at MaxRetryDelay %s", n, d, c.MaxRetryDelay)
		}
		reached = d == c.MaxRetryDelay
		prev = d
	}
	if !reached {
		t.Fatalf("never reached MaxRetryDelay %s", c.MaxRetryDelay)
	}
	if c.retryDelay(2) <= c.retryDelay(1) || c.retryDelay(3) <= c.retryDelay(2) {
		t.Fatalf("delays %s, %s, %s: want them to grow", c.retryDelay(1), c.retryDelay(2), c.retryDelay(3))
	}
}

// The shipped heartbeat is a third of the holders' ack wait — 2.67 s against
// 8 s — and follows the consumer's ack wait when that is changed; a
// heartbeat set in the config wins.
func TestTheDefaultHeartbeatIsAThirdOfTheConsumersAckWait(t *testing.T) {
	shipped := mesh.SeatConsumerSpec(mesh.Seat{Seat: mesh.BuildSeat}, 1).Config.AckWait
	if shipped != 8*time.Second || DefaultConfig().Heartbeat != 0 {
		t.Fatalf("the shipped ack wait is %s and heartbeat %s; this test expects 8s and the derived default", shipped, DefaultConfig().Heartbeat)
	}
	for _, tc := range []struct{ set, ackWait, want time.Duration }{
		{0, shipped, shipped / 3},
		{0, 0, shipped / 3}, // unknown: the holders' ack wait
		{0, 3 * time.Second, time.Second},
		{2 * time.Second, shipped, 2 * time.Second},
	} {
		if got := heartbeatEvery(tc.set, tc.ackWait); got != tc.want {
			t.Errorf("heartbeat set %s, ack wait %s: %s, want %s", tc.set, tc.ackWait, got, tc.want)
		}
	}
}
