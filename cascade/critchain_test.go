package cascade_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/mesh"
)

// critChain logs, with MESHBUILD_FLEET_CRIT=1, the chain of a run that
// ended it: from the module finished last, back through the base of each
// that finished last, each module's wait from that base's end to its
// start, and how long it took by the controller's record (started to
// built worked) against its simulated duration (nominal) and the
// duration its machine reported. A record's duration longer than the
// machine's is its built waiting for the controller: on three servers the
// first tiers' waited 0.4–0.8 s.
func critChain(tb testing.TB, js jetstream.JetStream, plan string, mods map[string]cascade.ModuleStatus, t0 time.Time, nominal map[string]time.Duration) {
	if os.Getenv("MESHBUILD_FLEET_CRIT") == "" {
		return
	}
	builts := critBuilts(tb, js, plan)
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
		if b, ok := builts[cur]; ok {
			tb.Logf("crit %-12s built: announced %8.1f (%.1f ms after the build's end), stored %8.1f, worked by the controller %8.1f", cur,
				ms(b.at.Sub(t0)), ms(b.at.Sub(m.Started.Add(m.Duration))), ms(b.stored.Sub(t0)), ms(m.Finished.Sub(t0)))
		}
		waits += m.Started.Sub(ready)
		durs += m.Finished.Sub(m.Started)
		nom += nominal[cur]
		cur = base
	}
	tb.Logf("crit: waits %v, durations %v, nominal %v, end %v", waits, durs, nom, mods[last].Finished.Sub(t0))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type builtSeen struct{ at, stored time.Time }

// critBuilts are the built events of plan in EVENTS, by module: when the
// machine announced each (its At) and when the server stored it.
func critBuilts(tb testing.TB, js jetstream.JetStream, plan string) map[string]builtSeen {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := map[string]builtSeen{}
	c, err := js.CreateConsumer(ctx, mesh.EventsStream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy,
		FilterSubject: mesh.HolderEventSubject(mesh.BuildSeat, "*", mesh.EventBuilt), InactiveThreshold: time.Minute})
	if err != nil {
		tb.Logf("crit: reading built events: %v", err)
		return out
	}
	info, err := c.Info(ctx)
	if err != nil {
		tb.Logf("crit: reading built events: %v", err)
		return out
	}
	for n, tries := uint64(0), 0; n < info.NumPending && tries < 100; {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			tries++ // a new consumer on a cluster may not answer yet
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for m := range batch.Messages() {
			n++
			var ev mesh.Built
			md, _ := m.Metadata()
			if json.Unmarshal(m.Data(), &ev) == nil && ev.Plan == plan && md != nil {
				out[ev.Module] = builtSeen{at: ev.At, stored: md.Timestamp}
			}
		}
		if batch.Error() != nil {
			tries++
		}
	}
	return out
}
