package cascade

import (
	"slices"
	"testing"
)

// Asks that come together fill one shard while machines there are idle,
// then go to the least loaded shard a holder is on; a shard with nobody on
// it gets none while another has a holder, and with every shard full they
// spread by load, ties in turn.
func TestRouteFillsAShardWhileItsMachinesAreIdle(t *testing.T) {
	// Shard 0: 3 idle; shard 1: 2 idle; shard 2: nobody; shard 3: 1 ask
	// queued more than its pulls waiting.
	v := &shardView{load: []int{-3, -2, 0, 1}, live: []bool{true, true, false, true}, last: -1}
	var got []int
	for range 9 {
		got = append(got, v.route())
	}
	// 0 0 0 fill shard 0 (least loaded, then kept while idle); 1 1 fill
	// shard 1; then shards 0, 1 and 3 are live and loaded 0, 0, 1: the
	// least loaded in turn, each ask counted.
	want := []int{0, 0, 0, 1, 1, 0, 1, 3, 0}
	if !slices.Equal(got, want) {
		t.Errorf("routed %v, want %v", got, want)
	}
	if slices.Contains(got, 2) {
		t.Errorf("shard 2, with nobody on it, was given an ask while others had holders")
	}

	// The shard kept is the last one's only while it is live: a look that
	// finds its holders gone moves the next ask on.
	v = &shardView{load: []int{-5, -1}, live: []bool{false, true}, last: 0}
	if k := v.route(); k != 1 {
		t.Errorf("routed to shard %d, whose holders are gone, want 1", k)
	}
	// No holder anywhere: in turn.
	v = &shardView{load: []int{0, 0, 0}, live: []bool{false, false, false}, last: -1}
	got = got[:0]
	for range 4 {
		got = append(got, v.route())
	}
	if want := []int{0, 1, 2, 0}; !slices.Equal(got, want) {
		t.Errorf("with no holder, routed %v, want %v", got, want)
	}
}
