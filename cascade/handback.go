package cascade

import (
	"slices"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// HandedBack is why a module's ask went back to the queue, from the
// handed-back event of the machine that gave it back (mesh.HandedBack).
type HandedBack struct {
	// Attempt is the ask's delivery that was given back (1 the first).
	Attempt int `json:"attempt"`
	// Why is the cause, in the machine's words.
	Why string `json:"why"`
	// On is the machine that gave it back.
	On string `json:"on"`
	// InfraSince is when the ask began failing on infrastructure, on any
	// machine: its --retry-for budget runs from then.
	InfraSince time.Time `json:"infra_since,omitzero"`
	// Next is when the ask is due again (a retry after a delay); zero
	// for at once.
	Next time.Time `json:"next,omitzero"`
	// Sick says the machine cannot build (its probe fails): the ask waits
	// for a healthy machine.
	Sick bool      `json:"sick,omitempty"`
	At   time.Time `json:"at"`
}

// HandedBack records that a holder gave the module's current ask back to
// the queue (ev): a note on the module, queued or building, that it is to
// be retried or waits for a healthy machine. The machine that gave it back
// is no longer the module's (On): the module is not shown building there.
// It reports whether the state changed; an event for another ask, or for a
// module not in flight, changes nothing.
func (s *State) HandedBack(ev mesh.HandedBack) bool {
	i, k, multi := s.platformAsk(ev.Plan, ev.Module, ev.Ask)
	if !multi {
		var ok bool
		if i, ok = s.current(ev.Plan, ev.Module, ev.Ask); !ok {
			return false
		}
	}
	m := &s.Modules[i]
	if m.State != Queued && m.State != Building {
		return false
	}
	note := &HandedBack{Attempt: ev.Attempt, Why: cut(ev.Why, maxMessage), On: ev.On, InfraSince: ev.InfraSince,
		Next: ev.Next, Sick: ev.Sick, At: ev.At}
	if m.HandedBack != nil && *m.HandedBack == *note {
		return false
	}
	m.HandedBack = note
	m.held(ev.On) // it may have given the ask back sooner than its started was due
	switch {
	case multi:
		if p := &m.Platforms[k]; p.State == Building && p.On == ev.On {
			p.State, p.On = Queued, ""
		}
		m.On = machinesOf(m.Platforms)
	case m.On == ev.On:
		m.On = ""
	}
	s.touch(ev.At)
	return true
}

// Lost is a machine that started a module's ask and then went silent —
// killed, or cut off from the bus — so that its claim of the ask lapsed and
// another machine started it (no hand-back said why: a machine that gives
// an ask back is a HandedBack). Kept with the module after it finishes, so
// that `builds show` says why its build ran twice and on which machines.
// On is empty when the machine is not known: it went silent before it
// announced a start (silentBefore), and the next delivery's attempt says
// an earlier one was lost.
type Lost struct {
	// On is the machine that went silent, empty when not known (it had
	// announced no start); Platform the platform it was building, for a
	// module built for several.
	On       string `json:"on"`
	Platform string `json:"platform,omitempty"`
	// Started is when it started the ask; Taken when the next machine,
	// TakenBy, did (each by the machine's own clock, as its started event
	// says).
	Started time.Time `json:"started,omitzero"`
	Taken   time.Time `json:"taken"`
	TakenBy string    `json:"taken_by"`
}

// silentBefore notes, when a module's (or platform's) ask is first heard
// of from its attempt-th delivery — started, or built by a machine that
// announced no start (a build shorter than agent.Config.StartedDelay) —
// that an earlier delivery ended without a word: its machine neither
// announced a start nor an outcome nor gave the ask back (the deliveries
// given back are counted from the module's HandedBack). It was killed or
// cut off in the first moments of the build (or its agent stopped then,
// and handed the ask back without a handed-back event); which machine is
// not known (no event of it was heard). A hand-back of another platform's
// ask can hide one of a module built for several (HandedBack is the
// module's). taken is when ev's machine began it.
func (m *ModuleStatus) silentBefore(platform string, attempt int, taken time.Time, on string) {
	want := 1
	if m.HandedBack != nil {
		want = m.HandedBack.Attempt + 1
	}
	if attempt > want && !taken.IsZero() {
		m.lost("", platform, time.Time{}, mesh.Started{At: taken, On: on})
	}
}

// later reports whether delivery, a started's, is a later delivery of the
// ask than began, the one its machine began (0: not known).
func later(delivery, began int) bool { return began > 0 && delivery > began }

// maxLost is how many lost holders a module keeps: the latest.
const maxLost = 4

// lost notes that machine on, which started the module at started, went
// silent and ev's machine started it.
func (m *ModuleStatus) lost(on, platform string, started time.Time, ev mesh.Started) {
	m.Lost = append(m.Lost, Lost{On: on, Platform: platform, Started: started, Taken: ev.At, TakenBy: ev.On})
	if len(m.Lost) > maxLost {
		m.Lost = slices.Delete(m.Lost, 0, len(m.Lost)-maxLost)
	}
}
