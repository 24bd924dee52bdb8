package cascade

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

// ModuleState is where a module of a plan is.
type ModuleState string

// Module states.
const (
	// Waiting: some in-plan base is not built yet.
	Waiting ModuleState = "waiting"
	// Ready: every in-plan base is built, and the ask is held by the
	// controller until the plan's window has room (only with a Window).
	Ready ModuleState = "ready"
	// Queued: its ask is submitted; no holder has started it.
	Queued ModuleState = "queued"
	// Building: a holder announced started.
	Building ModuleState = "building"
	// Built: pushed, with a digest.
	Built ModuleState = "built"
	// Unchanged: its input key was built before, so it was not submitted:
	// it has that build's digest, and Reuses names the plan that made it.
	Unchanged ModuleState = "unchanged"
	// Failed: the holder announced failed.
	Failed ModuleState = "failed"
	// Blocked: a base failed (transitively); BlockedBy names it.
	Blocked ModuleState = "blocked"
	// Cancelling: the plan was cancelled while the module's ask was in
	// flight; its holder has not yet said it stopped. A built that arrives
	// now is not the module's image: it is not current and releases
	// nothing.
	Cancelling ModuleState = "cancelling"
	// Cancelled: the plan was cancelled before the module finished, and
	// nothing works on it any more.
	Cancelled ModuleState = "cancelled"
	// Superseded: a newer plan for the same repository and ref builds it
	// (SupersededBy names it), and this plan had not started it, or
	// cancelled it for the newer plan; or a base it waited on was.
	Superseded ModuleState = "superseded"
)

// Finished reports whether a module in state s has its result in its plan
// (built, unchanged, failed, blocked, cancelled, superseded; until a
// retry): what persist stores before what it released, and what a watch
// waits for.
func (s ModuleState) Finished() bool {
	return s == Built || s == Unchanged || s == Failed || s == Blocked || s == Cancelled || s == Superseded
}

// Outcome is a plan's result.
type Outcome string

// Outcomes.
const (
	OutcomeRunning   Outcome = "running"
	OutcomeBuilt     Outcome = "built"
	OutcomeFailed    Outcome = "failed"
	OutcomeCancelled Outcome = "cancelled"
)

// Errors of state transitions; match them with errors.Is.
var (
	// ErrNotInPlan is wrapped when a module named is not in the plan.
	ErrNotInPlan = errors.New("module not in plan")
	// ErrNotFailed is wrapped when Retry names a module that has not failed.
	ErrNotFailed = errors.New("module has not failed")
	// ErrPlanCancelled is wrapped when a cancelled plan is asked to go on.
	ErrPlanCancelled = errors.New("plan cancelled")
	// ErrBadState is wrapped when a reloaded state is inconsistent.
	ErrBadState = errors.New("inconsistent plan state")
	// ErrNoBase is wrapped when a base outside a plan has no image to pin
	// the plan's asks to.
	ErrNoBase = errors.New("base has no image")
)

// StateVersion is the version of the persisted state this code writes.
const StateVersion = 1

// maxLog is how many of a failure's last log lines the state keeps.
const maxLog = 20

// State is the state of one plan: persisted as JSON and reloaded after a
// controller restart. Its exported fields are the whole state; everything
// else is an index rebuilt from them.
type State struct {
	Version int    `json:"version"`
	Plan    string `json:"plan"`
	// Seq is the plan's sequence number, assigned by the controller at
	// creation, monotonically increasing (see Newer).
	Seq     uint64          `json:"seq,omitempty"`
	Trigger planner.Trigger `json:"trigger"`
	// Summary is the trigger in one line, for display.
	Summary   string    `json:"summary"`
	Created   time.Time `json:"created"`
	Updated   time.Time `json:"updated"`
	Cancelled time.Time `json:"cancelled,omitzero"`
	// External are the digests of the bases outside the plan, by module:
	// resolved once when the plan is made, so that every ask of the plan
	// is pinned to the same base images.
	External map[string]string `json:"external,omitempty"`
	// Window is the most asks of the plan queued (published, not started)
	// at once; released asks beyond it are held, ready, and published best
	// first as holders start asks (see Fill). 0 is no limit: every released
	// ask is published at once. Negative holds every released ask until
	// the caller widens the window (the controller's scheduler does, for
	// each machine it gives the plan).
	Window int `json:"window,omitempty"`
	// Priority orders the plan against the others running: higher first
	// (the controller's scheduler); 0 is the default.
	Priority int `json:"priority"`
	// Owner is whom the plan's machine-time is counted to for fair share:
	// the trigger's repository unless the trigger named one.
	Owner string `json:"owner,omitempty"`
	// Cap is the most machines the plan may hold at once (its asks queued
	// or building); 0 is no cap.
	Cap int `json:"cap,omitempty"`
	// Superseding is when modules in flight were last cancelled for a newer
	// plan (Supersede with cancel): the bound of ExpireCancelling runs from
	// it.
	Superseding time.Time `json:"superseding,omitzero"`
	// Modules are in plan order (tier, name).
	Modules []ModuleStatus `json:"modules"`

	ix *index
	// known says whether an input key was built before (SetKnown).
	known func(key string) (KeyRecord, bool)
	// reused are the modules settled unchanged since Reused was called.
	reused []string
	// dispatched are the modules started since Dispatched was called.
	dispatched []string
}

// ModuleStatus is one module of a plan: what to build and where it is.
type ModuleStatus struct {
	Module string `json:"module"`
	Tier   int    `json:"tier"`
	// Bases are the in-plan bases, sorted: the module waits for them.
	Bases []string `json:"bases,omitempty"`
	// External are the bases outside the plan, at their current digest.
	External []string       `json:"external,omitempty"`
	Source   planner.Source `json:"source"`
	// Estimate is the expected build duration used to order asks; 0 is
	// unknown.
	Estimate time.Duration `json:"estimate,omitempty"`

	State   ModuleState `json:"state"`
	Ask     string      `json:"ask,omitempty"`
	Attempt int         `json:"attempt,omitempty"`
	// Delivery is the delivery of the ask its machine began it from (the
	// started's attempt: 1 the first); 0 when not known. A later delivery
	// begun by the same machine says the holder there went silent (a
	// process killed and restarted).
	Delivery int `json:"delivery,omitempty"`
	// Tree is the git tree id of the module's build context at its
	// commit (State.Address); empty when it is not known, and then the
	// module has no input key and is always submitted.
	Tree string `json:"tree,omitempty"`
	// DockerfileTree is the git tree id of the directory that holds its
	// Dockerfile when that lies outside the context
	// (mesh.DockerfileOutside), with Tree; empty otherwise.
	DockerfileTree string `json:"dockerfile_tree,omitempty"`
	// Key is the module's input key (InputKey), set when it is released.
	Key string `json:"key,omitempty"`
	// Reuses is the plan whose build of the same key an unchanged module
	// reuses.
	Reuses string `json:"reuses,omitempty"`
	// Inputs are the components of Key (see why.go); Previous is the
	// module's build before this plan, from when the plan was made.
	Inputs   *KeyInputs     `json:"inputs,omitempty"`
	Previous *PreviousBuild `json:"previous,omitempty"`
	// Why is WhyOf the module, filled in by readers (`builds show
	// --json`); the state never sets it.
	Why *Why `json:"why,omitempty"`
	// Commit is the commit built, from the built event.
	Commit string `json:"commit,omitempty"`
	Digest string `json:"digest,omitempty"`
	// Image is the pushed reference, repository@digest.
	Image string `json:"image,omitempty"`
	// Attestations are the provenance and SBOM pushed with the image, by
	// digest, from the built event (per platform in Platforms for a module
	// of several).
	Attestations *mesh.Attestations `json:"attestations,omitempty"`
	// On is the machine building or that built it.
	On       string        `json:"on,omitempty"`
	Queued   time.Time     `json:"queued,omitzero"`
	Started  time.Time     `json:"started,omitzero"`
	Finished time.Time     `json:"finished,omitzero"`
	Duration time.Duration `json:"duration,omitempty"`
	// Reason is a failure's class (mesh.ReasonBuild, ...).
	Reason  string   `json:"reason,omitempty"`
	Message string   `json:"message,omitempty"`
	Log     []string `json:"log,omitempty"`
	// BlockedBy is the failed module a blocked module waits on.
	BlockedBy string `json:"blocked_by,omitempty"`
	// Platforms are the asks of a module built for several platforms, one
	// per platform (see PlatformStatus); empty for one platform.
	Platforms []PlatformStatus `json:"platforms,omitempty"`
	// Waiting says why a queued ask is not taken, when it waits for a
	// platform no online holder builds ("no linux/arm64 machine online").
	Waiting string `json:"waiting,omitempty"`
	// ReadyAt is when every in-plan base was built (or there were none):
	// from then the module waits for a machine only.
	ReadyAt time.Time `json:"ready_at,omitzero"`
	// SupersededBy is the newer plan that superseded the module.
	SupersededBy string `json:"superseded_by,omitempty"`
	// HandedBack is set while the module's ask is back in the queue after
	// its holder gave it back (the handed-back event): to be retried
	// after a delay, or waiting for a healthy machine. It is a note, not a
	// state: the module stays queued or building, and the note goes with
	// its next started or outcome.
	HandedBack *HandedBack `json:"handed_back,omitempty"`
	// Lost are the machines that started the module's ask and went
	// silent, another machine taking it (the latest few).
	Lost []Lost `json:"lost,omitempty"`
	// Held are the machines whose started of the module's current ask
	// (or one of its platforms') the controller applied — or, for a build
	// that ended within its agent's StartedDelay, its outcome — each
	// once, in the order they started it (the latest few): its build
	// output is theirs, and a log batch from any other machine is not
	// shown.
	Held []string `json:"held,omitempty"`
}

// maxHeld is how many machines a module's Held keeps: the latest.
const maxHeld = 8

// held notes that machine on held the module's current ask (its started,
// or an outcome that came without one, was applied).
func (m *ModuleStatus) held(on string) {
	if on == "" || slices.Contains(m.Held, on) {
		return
	}
	m.Held = append(m.Held, on)
	if len(m.Held) > maxHeld {
		m.Held = slices.Delete(m.Held, 0, len(m.Held)-maxHeld)
	}
}

// HeldBy reports whether the plan saw machine on start the module's
// current ask. A module stored before Held was kept names its machines
// only in On, Lost and HandedBack: those count for it.
func (m ModuleStatus) HeldBy(on string) bool {
	if len(m.Held) > 0 || on == "" {
		return slices.Contains(m.Held, on)
	}
	if slices.Contains(strings.Split(m.On, ","), on) || (m.HandedBack != nil && m.HandedBack.On == on) {
		return true
	}
	return slices.ContainsFunc(m.Lost, func(l Lost) bool { return l.On == on || l.TakenBy == on })
}

// Submit is an ask the caller must publish (with Nats-Msg-Id = AskID).
type Submit struct {
	Plan    string `json:"plan"`
	Module  string `json:"module"`
	AskID   string `json:"ask_id"`
	Attempt int    `json:"attempt"`
	// Source is where to build from; an empty commit means the module's
	// current commit, which the caller resolves.
	Source planner.Source `json:"source"`
	// Key is the ask's input key (InputKey); empty when the module's
	// build context is not addressed.
	Key string `json:"key,omitempty"`
	// Tree is the git tree of the module's build context at the commit
	// (State.Address); empty when it is not addressed.
	Tree string `json:"tree,omitempty"`
	// Bases are the digests of every base, by module: the in-plan bases
	// at the digests this plan built them at, the others at the digests
	// resolved when the plan was made (State.External).
	Bases map[string]string `json:"bases,omitempty"`
}

// NewState starts the state of a plan: every module waiting. A plan with
// bases outside it (planner.Plan.External) is pinned to their digests with
// Pin before it starts.
func NewState(p planner.Plan, now time.Time) *State {
	s := &State{
		Version: StateVersion,
		Plan:    p.ID,
		Trigger: p.Trigger,
		Summary: p.Trigger.String(),
		Created: now,
		Updated: now,
		Modules: make([]ModuleStatus, len(p.Modules)),
	}
	for i, n := range p.Modules {
		m := ModuleStatus{
			Module: n.Module,
			Tier:   n.Tier,
			Bases:  slices.Clone(n.InPlanBases),
			Source: n.Source,
			State:  Waiting,
		}
		m.Source.Platforms = slices.Clone(n.Source.Platforms)
		for _, b := range n.On {
			if !slices.Contains(n.InPlanBases, b) {
				m.External = append(m.External, b)
			}
		}
		s.Modules[i] = m
	}
	s.ensure()
	return s
}

// Pin sets the digests of the plan's bases outside it, by module, resolved
// by the caller once, when the plan is made: every ask of the plan is then
// pinned to the same base images, and the ask is a pure function of the
// state. A base missing from digests is refused (ErrNoBase), naming the
// modules built on it, so that no ask goes out unpinned.
func (s *State) Pin(digests map[string]string) error {
	var missing []string
	ext := map[string]string{}
	for _, m := range s.Modules {
		for _, b := range m.External {
			d := digests[b]
			if d == "" {
				missing = append(missing, fmt.Sprintf("%s (needed by %s)", b, m.Module))
				continue
			}
			ext[b] = d
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("%w: %s", ErrNoBase, strings.Join(slices.Compact(missing), ", "))
	}
	if len(ext) > 0 {
		s.External = ext
	}
	return nil
}

// set moves module m (an element of s.Modules) to state to, keeping the
// census. Every change of a module's state goes through it.
func (s *State) set(m *ModuleStatus, to ModuleState) {
	s.ensure()
	s.ix.census[m.State]--
	s.ix.census[to]++
	m.State = to
	if to != Queued && to != Building {
		// Only an ask in the queue waits for a machine (Unserved), or
		// was given back to it.
		m.Waiting, m.HandedBack = "", nil
	}
}

// UnmarshalJSON decodes a persisted state and rebuilds its index, refusing
// (ErrBadState) a state whose modules do not form a plan.
func (s *State) UnmarshalJSON(data []byte) error {
	type plain State
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	if p.Version != StateVersion {
		return fmt.Errorf("%w: version %d, this controller reads %d", ErrBadState, p.Version, StateVersion)
	}
	ix, err := buildIndex(p.Modules)
	if err != nil {
		return err
	}
	*s = State(p)
	s.ix = ix
	return nil
}

// Module returns a module's status.
func (s *State) Module(name string) (ModuleStatus, bool) {
	s.ensure()
	i, ok := s.ix.pos[name]
	if !ok {
		return ModuleStatus{}, false
	}
	return s.Modules[i], true
}

// Start submits every module with no in-plan base still to build (up to
// the window). Calling it again submits nothing new.
func (s *State) Start(now time.Time) []Submit {
	s.ensure()
	if !s.Cancelled.IsZero() {
		return nil
	}
	for _, i := range s.ix.topo {
		if s.Modules[i].State == Waiting && s.ix.remaining[i] == 0 {
			s.release(i, now)
		}
	}
	return s.Fill(now)
}

// Started records that a holder began the module's current ask. It reports
// whether the state changed: a started for another ask, a duplicate, or one
// arriving after the module finished changes nothing. A later started of a
// building module (the ask redelivered to another machine) records the new
// machine.
func (s *State) Started(ev mesh.Started) bool {
	if i, k, ok := s.platformAsk(ev.Plan, ev.Module, ev.Ask); ok {
		return s.platformStarted(i, k, ev)
	}
	i, ok := s.current(ev.Plan, ev.Module, ev.Ask)
	if !ok {
		return false
	}
	m := &s.Modules[i]
	switch {
	case m.State == Queued:
		m.silentBefore("", ev.Attempt, ev.At, ev.On)
		s.set(m, Building)
		s.dispatched = append(s.dispatched, m.Module)
	case m.State == Building && ev.At.After(m.Started) && (ev.On != m.On || later(ev.Attempt, m.Delivery)):
		// Its claim moved: the machine that had it went silent (one that
		// gave the ask back is no longer the module's, On is empty), or
		// its holder there did and the machine began it again.
		if m.On != "" {
			m.lost(m.On, "", m.Started, ev)
		}
	case m.State == Cancelling && m.Started.IsZero():
		// Taken by a holder just as the plan was cancelled: it stays
		// cancelling, and the machine is known.
	default:
		return false
	}
	m.On, m.Started, m.HandedBack, m.Delivery = ev.On, ev.At, nil, ev.Attempt
	m.held(ev.On)
	s.touch(ev.At)
	return true
}

// builtUnstarted notes the start of a module built before its machine
// announced it started (a build shorter than agent.Config.StartedDelay
// announces only its outcome): on that machine, at its outcome's time less
// the build's duration, both by the machine's clock as a started's are.
func (s *State) builtUnstarted(m *ModuleStatus, on string, at time.Time, took time.Duration) {
	if on == "" || at.IsZero() {
		return
	}
	m.Started = at.Add(-max(0, took))
	m.held(on)
	s.dispatched = append(s.dispatched, m.Module)
}

// HolderOf is the machine the plan saw start ask (module's ask, or one of
// its platforms') and still building it: the machine whose started was
// applied last. Empty when the ask is not the module's current one, or no
// machine is building it (queued, handed back, settled).
func (s *State) HolderOf(plan, module, ask string) string {
	if i, k, ok := s.platformAsk(plan, module, ask); ok {
		if p := s.Modules[i].Platforms[k]; p.State == Building {
			return p.On
		}
		return ""
	}
	i, ok := s.current(plan, module, ask)
	if !ok {
		return ""
	}
	if m := s.Modules[i]; m.State == Building || m.State == Cancelling {
		return m.On
	}
	return ""
}

// Built records the module's image and returns the asks of the dependents
// whose last in-plan base it was, in release order (with a window: the best
// ready asks the window has room for). A built for another ask (an earlier
// attempt, another plan) or a duplicate changes nothing and returns
// nothing.
func (s *State) Built(ev mesh.Built, now time.Time) []Submit {
	if i, k, ok := s.platformAsk(ev.Plan, ev.Module, ev.Ask); ok {
		s.platformBuilt(i, k, ev, now)
		return nil
	}
	i, ok := s.current(ev.Plan, ev.Module, ev.Ask)
	if !ok {
		return nil
	}
	m := &s.Modules[i]
	if len(m.Platforms) > 0 && m.State != Cancelling && !allBuilt(m.Platforms) {
		// A module built for several platforms is built by its index,
		// once every platform is.
		return nil
	}
	if m.State == Cancelling {
		// The holder finished before it heard of the cancel: the image
		// is not the plan's (the plan was cancelled), so it is neither
		// current nor a base of anything.
		s.stopped(m, ev.On, "", "built after the plan was cancelled: "+ev.Image, now)
		return nil
	}
	if m.State != Queued && m.State != Building {
		return nil
	}
	if m.State == Queued {
		s.builtUnstarted(m, ev.On, ev.At, ev.Duration)
		m.silentBefore("", ev.Attempt, m.Started, ev.On)
	}
	s.set(m, Built)
	m.Commit, m.Digest, m.Image = ev.Commit, ev.Digest, ev.Image
	m.Attestations = ev.Attestations
	if ev.On != "" {
		m.On = ev.On
	}
	m.Finished = now
	m.Duration = ev.Duration
	if m.Duration == 0 && !m.Started.IsZero() {
		m.Duration = now.Sub(m.Started)
	}
	s.ix.built(m.Duration)
	s.touch(now)
	s.releaseDependents(i, now)
	return s.Fill(now)
}

// Failed records the module's failure and blocks every module built on it,
// transitively; it returns the modules it newly blocked. A failed for
// another ask or a duplicate changes nothing and returns nothing. A failed
// of a cancelling module (failed{cancelled}: its holder stopped) makes it
// cancelled and blocks nothing.
func (s *State) Failed(ev mesh.Failed, now time.Time) []string {
	if i, k, ok := s.platformAsk(ev.Plan, ev.Module, ev.Ask); ok {
		return s.platformFailed(i, k, ev, now)
	}
	i, ok := s.current(ev.Plan, ev.Module, ev.Ask)
	if !ok {
		return nil
	}
	m := &s.Modules[i]
	if m.State == Cancelling {
		s.stopped(m, ev.On, ev.Reason, ev.Message, now)
		return nil
	}
	if m.State != Queued && m.State != Building {
		return nil
	}
	// A build that failed sooner than its agent's StartedDelay announced
	// no started: its machine held the ask all the same (its output is
	// the module's, builtUnstarted).
	m.held(ev.On)
	s.set(m, Failed)
	m.Reason, m.Message = ev.Reason, cut(ev.Message, maxMessage)
	m.Log = trimLog(ev.Log)
	if ev.On != "" {
		m.On = ev.On
	}
	m.Finished = now
	if !m.Started.IsZero() {
		m.Duration = now.Sub(m.Started)
	}
	s.touch(now)

	var blocked []string
	queue := []int{i}
	for k := 0; k < len(queue); k++ {
		for _, d := range s.ix.deps[queue[k]] {
			dm := &s.Modules[d]
			if dm.State != Waiting {
				continue // already blocked (by an earlier failure), or cancelled
			}
			s.set(dm, Blocked)
			dm.BlockedBy = m.Module
			blocked = append(blocked, dm.Module)
			queue = append(queue, d)
		}
	}
	slices.Sort(blocked)
	return blocked
}

// Retry re-submits a failed module as a new attempt with a new ask id
// (at once, whatever the window: an operator asked), and puts the modules
// it blocked back to waiting (those still blocked by another failed module
// stay blocked, naming it). They are released when it is built.
func (s *State) Retry(module string, now time.Time) (Submit, error) {
	s.ensure()
	i, ok := s.ix.pos[module]
	switch {
	case !ok:
		return Submit{}, fmt.Errorf("retrying %q: %w %s", module, ErrNotInPlan, s.Plan)
	case !s.Cancelled.IsZero():
		return Submit{}, fmt.Errorf("retrying %q: %w %s", module, ErrPlanCancelled, s.Plan)
	case s.Modules[i].State != Failed:
		return Submit{}, fmt.Errorf("retrying %q: %w: it is %s", module, ErrNotFailed, s.Modules[i].State)
	}
	m := &s.Modules[i]
	s.set(m, Waiting)
	subs := s.submit([]int{i}, now)
	s.reblock(i)
	return subs[0], nil
}

// reblock recomputes the blocked modules downstream of i, bases first: a
// module stays blocked while a base is failed or blocked, naming the failed
// module (its previous one if still valid), and is waiting otherwise.
func (s *State) reblock(i int) {
	down := make([]bool, len(s.Modules))
	queue := []int{i}
	for k := 0; k < len(queue); k++ {
		for _, d := range s.ix.deps[queue[k]] {
			if !down[d] && s.Modules[d].State == Blocked {
				down[d] = true
				queue = append(queue, d)
			}
		}
	}
	for _, d := range s.ix.topo {
		if !down[d] {
			continue
		}
		dm := &s.Modules[d]
		var by []string
		for _, b := range s.ix.bases[d] {
			switch bm := s.Modules[b]; bm.State {
			case Failed:
				by = append(by, bm.Module)
			case Blocked:
				by = append(by, bm.BlockedBy)
			}
		}
		switch {
		case len(by) == 0:
			s.set(dm, Waiting)
			dm.BlockedBy = ""
		case !slices.Contains(by, dm.BlockedBy):
			dm.BlockedBy = slices.Min(by)
		}
	}
}

// stopped settles a cancelling module as cancelled, or as superseded when
// it was cancelled for a newer plan (then so are the modules waiting on
// it).
func (s *State) stopped(m *ModuleStatus, on, reason, message string, now time.Time) {
	if m.SupersededBy != "" {
		s.set(m, Superseded)
		s.supersedeDown(s.ix.pos[m.Module], m.SupersededBy, now)
	} else {
		s.set(m, Cancelled)
	}
	m.Finished = now
	if on != "" {
		m.On = on
	}
	m.Reason, m.Message = reason, message
	if !m.Started.IsZero() {
		m.Duration = now.Sub(m.Started)
	}
	s.touch(now)
}

// Pending returns the asks of every queued module, in release order: after
// a reload, the controller re-submits them (the bus drops those it already
// has, by ask id), replays the events since the state was saved, and calls
// Fill.
func (s *State) Pending() []Submit {
	s.ensure()
	var q []int
	for i := range s.Modules {
		if s.Modules[i].State == Queued {
			q = append(q, i)
		}
	}
	s.order(q)
	out := make([]Submit, len(q))
	for k, i := range q {
		out[k] = s.submitOf(i)
	}
	return out
}

// submit queues ready modules as a new attempt each, in release order.
func (s *State) submit(ready []int, now time.Time) []Submit {
	if len(ready) == 0 {
		return nil
	}
	s.order(ready)
	out := make([]Submit, len(ready))
	for k, i := range ready {
		m := &s.Modules[i]
		m.Attempt++
		m.Ask = AskID(s.Plan, m.Module, m.Attempt)
		if m.State != Ready {
			m.ReadyAt = now // a retry, submitted at once
		}
		s.set(m, Queued)
		m.Queued = now
		m.Started, m.Finished, m.Duration = time.Time{}, time.Time{}, 0
		m.On, m.Reason, m.Message, m.Log, m.BlockedBy, m.Held = "", "", "", nil, "", nil
		m.Commit, m.Digest, m.Image, m.Reuses, m.Waiting = "", "", "", "", ""
		m.Attestations = nil
		s.askPlatforms(m)
		out[k] = s.submitOf(i)
	}
	s.touch(now)
	return out
}

func (s *State) submitOf(i int) Submit {
	m := s.Modules[i]
	sub := Submit{Plan: s.Plan, Module: m.Module, AskID: m.Ask, Attempt: m.Attempt, Source: m.Source, Key: m.Key, Tree: m.Tree}
	sub.Source.Platforms = slices.Clone(m.Source.Platforms)
	if n := len(s.ix.bases[i]) + len(m.External); n > 0 {
		sub.Bases = make(map[string]string, n)
		for _, b := range s.ix.bases[i] {
			sub.Bases[s.Modules[b].Module] = s.Modules[b].Digest
		}
		for _, b := range m.External {
			sub.Bases[b] = s.External[b]
		}
	}
	return sub
}

func (s *State) touch(now time.Time) {
	if now.After(s.Updated) {
		s.Updated = now
	}
}

// done reports whether a module in state st has its image: built, or
// unchanged.
func (st ModuleState) done() bool { return st == Built || st == Unchanged }

// Dispatched returns the modules a holder started since it was last
// called, in the order they started: the caller measures how long each
// waited from ready (ModuleStatus.ReadyAt) to started.
func (s *State) Dispatched() []string {
	out := s.dispatched
	s.dispatched = nil
	return out
}

// release makes a waiting module whose in-plan bases are all done ready,
// with its input key; a key built before (and a plan not forced) settles it
// unchanged at once instead, releasing its dependents in turn.
func (s *State) release(i int, now time.Time) {
	m := &s.Modules[i]
	m.Key, m.Inputs = s.keyOf(i), s.inputsOf(i)
	if m.Key != "" && s.known != nil && !s.Trigger.Force {
		if rec, ok := s.known(m.Key); ok && rec.Digest != "" {
			s.set(m, Unchanged)
			m.Digest, m.Image, m.Reuses = rec.Digest, rec.Image, rec.Plan
			m.Commit, m.Finished = m.Source.Commit, now
			s.reused = append(s.reused, m.Module)
			s.touch(now)
			s.releaseDependents(i, now)
			return
		}
	}
	s.set(m, Ready)
	m.ReadyAt = now
}

// releaseDependents counts module i done for its dependents and releases
// those it was the last base of.
func (s *State) releaseDependents(i int, now time.Time) {
	for _, d := range s.ix.deps[i] {
		s.ix.remaining[d]--
		if s.ix.remaining[d] == 0 && s.Modules[d].State == Waiting {
			s.release(d, now)
		}
	}
}
