package cascade

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/meshbuild/meshbuild/mesh"
)

// The worst record a failure can make — every line and the message as long
// as they come, of characters JSON spells in six bytes — fits the bucket.
func TestTheWorstFailedRecordFitsTheBucket(t *testing.T) {
	st := NewState(plan(t, "m:"), t0)
	sub := st.Start(t0)[0]
	ugly := strings.Repeat("\x01", 3<<20)
	log := make([]string, 500)
	for i := range log {
		log[i] = ugly
	}
	f := failed(sub, 1)
	f.Message, f.Log = ugly, log
	st.Failed(f, at(1))
	ms := stateOf(t, st, "m")
	data, err := json.Marshal(ms)
	if err != nil {
		t.Fatal(err)
	}
	if ms.State != Failed || len(data) > mesh.BucketMaxValue || len(ms.Log) != maxLog {
		t.Fatalf("record %d bytes, %d lines, state %s: want failed, %d lines, at most %d bytes", len(data), len(ms.Log), ms.State, maxLog, mesh.BucketMaxValue)
	}
	if c := cut("ééééé", 9); !utf8.ValidString(c) || len(c) > 9 {
		t.Fatalf("cut %q: want valid UTF-8 of at most 9 bytes", c)
	}
}

// A queued ask older than the seat's retain fails its module, blocking
// its dependents; a younger one stays queued.
func TestAnAskOlderThanTheRetainExpires(t *testing.T) {
	st := NewState(plan(t, "a:", "b: a", "c:"), t0)
	st.Start(t0)
	if got := st.Expire(t0.Add(time.Hour), 2*time.Hour); len(got) != 0 {
		t.Fatalf("expired %v within the retain", got)
	}
	got := st.Expire(t0.Add(2*time.Hour), 2*time.Hour)
	if strings.Join(got, ",") != "a,b,c" && strings.Join(got, ",") != "c,a,b" {
		t.Fatalf("expired %v: want a (blocking b) and c", got)
	}
	if a := stateOf(t, st, "a"); a.State != Failed || a.Reason != mesh.ReasonInfra || !strings.Contains(a.Message, "expired") {
		t.Fatalf("a: %+v", a)
	}
	if b := stateOf(t, st, "b"); b.State != Blocked || b.BlockedBy != "a" {
		t.Fatalf("b: %+v", b)
	}
}
