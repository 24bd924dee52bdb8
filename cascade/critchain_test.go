package cascade_test

import (
	"os"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
)

// critChain logs, with MESHBUILD_FLEET_CRIT=1, the chain of a run that
// ended it: from the module finished last, back through the base of each
// that finished last, each module's wait from that base's end to its
// start, and how long it took by the controller's record (started to
// built worked) against its simulated duration (nominal) and the
// duration its machine reported. A record's duration longer than the
// machine's is its built waiting for the controller: on three servers the
// first tiers' waited 0.4–0.8 s.
func critChain(tb testing.TB, mods map[string]cascade.ModuleStatus, t0 time.Time, nominal map[string]time.Duration) {
	if os.Getenv("MESHBUILD_FLEET_CRIT") == "" {
		return
	}
	var last string
	for n, m := range mods {
		if last == "" || m.Finished.After(mods[last].Finished) {
			last = n
		}
	}
	var waits, durs, nom time.Duration
	cur := last
	for cur != "" {
		m := mods[cur]
		var base string
		for _, b := range m.Bases {
			if base == "" || mods[b].Finished.After(mods[base].Finished) {
				base = b
			}
		}
		ready := t0
		if base != "" {
			ready = mods[base].Finished
		}
		tb.Logf("crit %-12s tier %d ready %8.1f queued %8.1f started %8.1f (wait %6.1f ms) dur %8.1f nominal %8.1f machine %s", cur, m.Tier,
			ms(ready.Sub(t0)), ms(m.Queued.Sub(t0)), ms(m.Started.Sub(t0)), ms(m.Started.Sub(ready)), ms(m.Finished.Sub(m.Started)), ms(nominal[cur]), m.Duration)
		waits += m.Started.Sub(ready)
		durs += m.Finished.Sub(m.Started)
		nom += nominal[cur]
		cur = base
	}
	tb.Logf("crit: waits %v, durations %v, nominal %v, end %v", waits, durs, nom, mods[last].Finished.Sub(t0))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
