package cascade

import (
	"testing"
	"time"
)

// A module's estimate is stored again only when it moved by more than a
// tenth or EstimateSlack: the first one always.
func TestEstimateMoved(t *testing.T) {
	for _, c := range []struct {
		stored, now time.Duration
		want        bool
	}{
		{0, time.Millisecond, true},
		{time.Millisecond, 3 * time.Millisecond, false},
		{time.Second, 1400 * time.Millisecond, false},
		{time.Second, 1600 * time.Millisecond, true},
		{time.Second, 400 * time.Millisecond, true},
		{time.Minute, 65 * time.Second, false},
		{time.Minute, 67 * time.Second, true},
		{time.Minute, 53 * time.Second, true},
	} {
		if got := estimateMoved(c.stored, c.now); got != c.want {
			t.Errorf("estimateMoved(%s, %s) = %v, want %v", c.stored, c.now, got, c.want)
		}
	}
}
