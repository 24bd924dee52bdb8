package cascade

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// The scheduler decides, each time machines are idle, which running plans
// get them (Config.Window WindowIdle, the default; a window of 0 or N
// publishes per plan and cannot rank across plans). Across plans:
//
//  1. Highest priority first (State.Priority).
//  2. Among plans of equal priority, machines are shared by owner
//     (State.Owner: the trigger's repository unless it named one) in
//     proportion to each owner's weight (Config.Shares), by the machine-time
//     each consumed recently: a sum of build durations that halves every
//     Config.ShareHalfLife (Hydra's scheduling shares), plus the expected
//     time of the asks it holds now. The next machine goes to the owner
//     whose sum divided by its weight is lowest, and its sum grows by the
//     plan's expected build time; so two owners pushed together each get
//     about half of the machines until one runs out of ready work. Between
//     plans of one owner the older goes first.
//  3. A plan (State.Cap) or an owner (Config.Caps) capped at N never holds
//     more than N machines; a machine it cannot take goes to the next plan,
//     so a cap never idles a machine another plan could use.
//
// Inside a plan the order stays longest remaining path first (State.Fill).
// Allot is the pure part: who gets how many of the idle machines, and what
// the plans left waiting wait behind.

// Claim is a running plan as the scheduler sees it.
type Claim struct {
	Plan     string
	Priority int
	Owner    string
	// Seq orders plans of one owner: the older (lower) first.
	Seq uint64
	// Ready is how many asks the plan holds for a machine.
	Ready int
	// Busy is how many machines the plan holds now: its asks queued,
	// building or cancelling.
	Busy int
	// Cap is the plan's cap; 0 is none.
	Cap int
	// Estimate is how long one of its asks is expected to take, in
	// seconds (State.MeanEstimate).
	Estimate float64
}

// SharePolicy is how machines are shared across owners.
type SharePolicy struct {
	// Weights are the owners' shares; an owner not named weighs 1.
	Weights map[string]float64
	// Caps are the most machines an owner's plans may hold at once.
	Caps map[string]int
}

func (p SharePolicy) weight(owner string) float64 {
	if w, ok := p.Weights[owner]; ok && w > 0 {
		return w
	}
	return 1
}

// Allotment is the scheduler's answer.
type Allotment struct {
	// Give is how many idle machines each plan gets, by plan.
	Give map[string]int
	// Held says, by plan, what its ready asks left waiting wait behind.
	Held map[string]string
}

// Allot shares idle machines among the claims (every running plan, those
// with nothing ready too: they hold machines), by the policy above; usage
// is each owner's decayed machine-time in seconds (Shares.Now).
func Allot(idle int, claims []Claim, usage map[string]float64, p SharePolicy) Allotment {
	a := Allotment{Give: map[string]int{}, Held: map[string]string{}}
	ownerBusy := map[string]int{}
	load := map[string]float64{}
	for _, c := range claims {
		ownerBusy[c.Owner] += c.Busy
		load[c.Owner] += float64(c.Busy) * c.Estimate
	}
	for o := range load {
		load[o] = (load[o] + usage[o]) / p.weight(o)
	}
	for o, u := range usage {
		if _, ok := load[o]; !ok {
			load[o] = u / p.weight(o)
		}
	}
	// Candidates: plans with something ready, highest priority first.
	var cands []int
	for i, c := range claims {
		if c.Ready > 0 {
			cands = append(cands, i)
		}
	}
	slices.SortFunc(cands, func(x, y int) int {
		return cmp.Or(cmp.Compare(claims[y].Priority, claims[x].Priority), cmp.Compare(claims[x].Seq, claims[y].Seq))
	})
	room := func(i int) bool {
		c := claims[i]
		g := a.Give[c.Plan]
		if g >= c.Ready || (c.Cap > 0 && c.Busy+g >= c.Cap) {
			return false
		}
		oc, ok := p.Caps[c.Owner]
		return !ok || oc <= 0 || ownerBusy[c.Owner] < oc
	}
	for idle > 0 {
		best := -1
		for _, i := range cands {
			if !room(i) {
				continue
			}
			if best >= 0 && claims[i].Priority < claims[best].Priority {
				break // cands are by priority: no better one further on
			}
			if best < 0 || load[claims[i].Owner] < load[claims[best].Owner] {
				best = i
			}
		}
		if best < 0 {
			break
		}
		c := claims[best]
		a.Give[c.Plan]++
		ownerBusy[c.Owner]++
		load[c.Owner] += c.Estimate / p.weight(c.Owner)
		idle--
	}
	for _, i := range cands {
		c := claims[i]
		if c.Ready > a.Give[c.Plan] {
			a.Held[c.Plan] = heldBehind(c, a, claims, ownerBusy, p)
		}
	}
	return a
}

// heldBehind says what a plan's ready asks left waiting wait behind: its
// cap, its owner's, or the plan holding most machines among those that
// outrank it (higher priority first).
func heldBehind(c Claim, a Allotment, claims []Claim, ownerBusy map[string]int, p SharePolicy) string {
	g := a.Give[c.Plan]
	if c.Cap > 0 && c.Busy+g >= c.Cap {
		return fmt.Sprintf("capped at %d %s", c.Cap, machines(c.Cap))
	}
	if oc, ok := p.Caps[c.Owner]; ok && oc > 0 && ownerBusy[c.Owner] >= oc {
		return fmt.Sprintf("owner %s capped at %d %s", c.Owner, oc, machines(oc))
	}
	best, busiest := -1, 0
	for i, o := range claims {
		n := o.Busy + a.Give[o.Plan]
		if o.Plan == c.Plan || n == 0 {
			continue
		}
		if best < 0 || o.Priority > claims[best].Priority || (o.Priority == claims[best].Priority && n > busiest) {
			best, busiest = i, n
		}
	}
	if best < 0 {
		if c.Busy+g > 0 {
			return fmt.Sprintf("%d %s busy with this plan", c.Busy+g, machines(c.Busy+g))
		}
		return "no machine idle"
	}
	o := claims[best]
	return fmt.Sprintf("%d %s busy with plan %s (priority %d)", busiest, machines(busiest), o.Plan, o.Priority)
}

func machines(n int) string {
	if n == 1 {
		return "machine"
	}
	return "machines"
}

// Share is an owner's recent machine-time: Seconds at At, halving every
// half-life since. Persisted (share.<hash>) so that a restarted controller
// keeps the shares.
type Share struct {
	Owner   string    `json:"owner"`
	Seconds float64   `json:"seconds"`
	At      time.Time `json:"at"`
}

// Now is the share's machine-time decayed to now.
func (s Share) Now(now time.Time, halfLife time.Duration) float64 {
	if s.Seconds == 0 || halfLife <= 0 || !now.After(s.At) {
		return s.Seconds
	}
	return s.Seconds * math.Exp2(-now.Sub(s.At).Seconds()/halfLife.Seconds())
}

// Add charges d of machine-time at now.
func (s Share) Add(d time.Duration, now time.Time, halfLife time.Duration) Share {
	at := s.At
	if now.After(at) {
		at = now
	}
	return Share{Owner: s.Owner, Seconds: s.Now(now, halfLife) + d.Seconds(), At: at}
}
