package claim

import "time"

// SetMonotonicNow sets Held's clock for a test, and returns what puts it back.
func SetMonotonicNow(now func() time.Time) (restore func()) {
	old := monotonicNow
	monotonicNow = now
	return func() { monotonicNow = old }
}
