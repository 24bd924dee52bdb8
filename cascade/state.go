// Package cascade executes a plan: it turns built and failed events into the
// next build asks. The heart of it is [State], a pure state machine for one
// plan: it does no I/O, and every transition returns what the caller must do
// (submit these asks, cancel those), so it is tested without a bus and
// replayed after a restart.
//
// # A module's life in a plan
//
//	waiting ──(last in-plan base built)──► ready ──(room in the window)──► queued ──started──► building ──built──► built
//	   │                                                                   │                    │
//	   │                                                                   └───────failed───────┴──► failed ──Retry──► queued
//	   └──(a base failed, transitively)──► blocked ──(the failed base retried)──► waiting
//	waiting, ready ──Cancel──► cancelled
//	queued, building ──Cancel──► cancelling ──(the holder's failed or built, the ask withdrawn unseen, or the bound)──► cancelled
//	waiting, ready ──Supersede──► superseded
//	queued, building ──Supersede (cancel)──► cancelling ──(as above)──► superseded
//
// # Superseded
//
// A newer plan for the same repository and ref supersedes what an older
// plan has not started ([State.Supersede]): every waiting or ready module
// the newer plan builds too settles superseded, naming the newer plan in
// SupersededBy, and so does every module waiting on a superseded one,
// transitively (its base will not be built in this plan). What is in
// flight finishes, or, when the caller asks, is cancelled and settles
// superseded when its holder stops. Superseded is a result, as unchanged
// is: a plan whose every module is built, unchanged or superseded is built.
//
// A module is submitted when its last in-plan base is built: the cascade
// counts, per module, the in-plan bases it still waits for, and a built
// event releases the dependents whose count it brings to zero. There is no
// tier barrier: tiers are a view. A module is submitted once per plan
// however many of its bases changed, pinned to the digests its in-plan bases
// were just built at; its external bases (outside the plan) stay at their
// current digest, resolved once when the plan is made and kept in the state
// ([State.External]), so that every [Submit] carries the digest of every
// base.
//
// # Inputs seen before: unchanged, and early cutoff
//
// A module whose build context is addressed ([State.Address]: the git tree
// id of its context path at the plan's commit) gets an input key
// ([InputKey]) when it is released: a hash of the module, its platform,
// the tree id, its Dockerfile path and the digest of every base. The
// caller says which keys were built before and at what digest
// ([State.SetKnown]); a released module whose key was is not submitted: it
// settles at once as unchanged, reusing that digest (Reuses names the plan
// that built it), and releases its dependents like a built module. So a
// module built again whose digest comes out as it was (images are
// reproducible) gives its dependents the keys they had: they settle
// unchanged, and the cascade stops there (early cutoff). A plan whose
// trigger is forced (planner.Trigger.Force) submits every module.
//
// A failed module blocks every module built on it, transitively, each
// recording the failed module in BlockedBy, so nothing is built against a
// stale base. Retrying the failed module (a new attempt, a new ask id) puts
// them back to waiting, and its success releases them.
//
// # Idempotence and restarts
//
// Ask ids are derived ([AskID]) from the plan id, the module and the
// attempt, so re-publishing an ask (with Nats-Msg-Id = ask id) after a
// controller restart is deduplicated by the bus. An event is applied only if
// it names the module's current ask id in a state it can leave: a duplicate
// built, a late failed from an earlier attempt or a started after built
// changes nothing and returns nothing.
//
// State marshals to JSON (the controller keeps it in a KV bucket) and is
// reloaded with json.Unmarshal; after a reload the controller replays the
// events since the last save and re-submits [State.Pending] (a no-op for
// asks the bus already has).
//
// # Order of asks
//
// Asks released together (by [State.Start] or one built event) are returned
// in descending remaining critical path: the longest sum of estimated
// durations from the module to the end of the plan ([State.SetEstimates];
// without estimates every module counts 1, i.e. the longest chain of
// modules); ties go to the lower tier, then the name.
//
// The work queue is first in, first out, so ordering each batch helps
// little on a deep plan: what is already queued goes first. With a
// [State.Window] the controller holds released asks (state ready) and keeps
// at most Window of the plan's asks queued; whenever a holder starts one
// ([State.Started], then [State.Fill]) the best held ask is published, so
// the next idle machine takes the module holding up most of the plan. The
// simulator ([Simulate], see sim.go) measures a 1,000-module plan on 50
// machines at 1.08× the lower bound with no window and 1.004× with a window
// of 1 and duration estimates (1.02× with a window of 5). A State's Window
// 0 publishes everything at once (the controller's default is
// WindowIdle, see Config.Window).
//
// # Newer commit wins
//
// Each plan carries a sequence number the controller assigns at creation
// ([State.Seq]: a push's place on the bus, its EVENTS sequence, so that a
// push delivered again after a crash is still older than a later push;
// for a plan requested by tool, the next after every plan made), and its
// creation time. A built
// result may replace a module's current digest only if its plan is newer
// than the plan that produced the current one ([Newer]): a higher sequence
// wins; at equal sequence a later creation time wins; a tie replaces
// nothing. So a slow build of an old push finishing after a newer push's
// build never rolls the module back, and replaying a plan's own results is a
// no-op.
//
// A State is not safe for concurrent use: the controller serialises the
// events of a plan.
package cascade

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"regexp"
	"slices"
	"strconv"
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

// KeyRecord is what an input key was built to: kept by the caller, one per
// key, and handed to the state by the lookup SetKnown sets.
type KeyRecord struct {
	Digest string `json:"digest"`
	Image  string `json:"image,omitempty"`
	Module string `json:"module"`
	// Plan is the plan that built it.
	Plan   string `json:"plan"`
	Commit string `json:"commit,omitempty"`
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
	// Tree is the git tree id of the module's build context at its
	// commit (State.Address); empty when it is not known, and then the
	// module has no input key and is always submitted.
	Tree string `json:"tree,omitempty"`
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
}

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
	// Bases are the digests of every base, by module: the in-plan bases
	// at the digests this plan built them at, the others at the digests
	// resolved when the plan was made (State.External).
	Bases map[string]string `json:"bases,omitempty"`
}

// Counts are how many modules of a plan are in each state.
type Counts struct {
	Waiting    int `json:"waiting"`
	Ready      int `json:"ready"`
	Queued     int `json:"queued"`
	Building   int `json:"building"`
	Built      int `json:"built"`
	Unchanged  int `json:"unchanged,omitempty"`
	Failed     int `json:"failed"`
	Blocked    int `json:"blocked"`
	Cancelling int `json:"cancelling,omitempty"`
	Cancelled  int `json:"cancelled"`
	Superseded int `json:"superseded,omitempty"`
	Total      int `json:"total"`
}

// add is the sum of two counts.
func (c Counts) add(o Counts) Counts {
	return Counts{Waiting: c.Waiting + o.Waiting, Ready: c.Ready + o.Ready, Queued: c.Queued + o.Queued,
		Building: c.Building + o.Building, Built: c.Built + o.Built, Unchanged: c.Unchanged + o.Unchanged,
		Failed: c.Failed + o.Failed, Blocked: c.Blocked + o.Blocked, Cancelling: c.Cancelling + o.Cancelling,
		Cancelled: c.Cancelled + o.Cancelled, Superseded: c.Superseded + o.Superseded, Total: c.Total + o.Total}
}

// ByState is the counts by module state name, every state present.
func (c Counts) ByState() map[string]int {
	return map[string]int{
		string(Waiting): c.Waiting, string(Ready): c.Ready, string(Queued): c.Queued, string(Building): c.Building,
		string(Built): c.Built, string(Unchanged): c.Unchanged, string(Failed): c.Failed, string(Blocked): c.Blocked,
		string(Cancelling): c.Cancelling, string(Cancelled): c.Cancelled, string(Superseded): c.Superseded,
	}
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

// index is derived from the exported fields: rebuilt on load.
type index struct {
	pos       map[string]int
	deps      [][]int // in-plan dependents
	bases     [][]int
	topo      []int // a topological order (bases first)
	remaining []int // in-plan bases not built
	rank      []float64
	// census is how many modules are in each state, kept by set: Counts,
	// Outcome and Fill read it instead of walking every module (the
	// controller asks them on every event and flush of a plan of
	// thousands).
	census map[ModuleState]int
	// tiers is the plan's number of tiers; multi whether any module is
	// built for several platforms (Unindexed has nothing to find
	// otherwise).
	tiers int
	multi bool
	// meanEst is the mean of the known estimates in seconds, 1 when none
	// is known (MeanEstimate).
	meanEst float64
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

func (s *State) ensure() {
	if s.ix == nil {
		ix, _ := buildIndex(s.Modules)
		s.ix = ix
	}
}

// buildIndex indexes modules; the error reports an inconsistency (the index
// is still usable: unknown bases are ignored, a cycle's modules are
// appended to the order).
func buildIndex(ms []ModuleStatus) (*index, error) {
	var errs []error
	n := len(ms)
	ix := &index{pos: make(map[string]int, n), deps: make([][]int, n), bases: make([][]int, n),
		remaining: make([]int, n), rank: make([]float64, n), census: map[ModuleState]int{}}
	for _, m := range ms {
		ix.census[m.State]++
		ix.tiers = max(ix.tiers, m.Tier+1)
		ix.multi = ix.multi || len(platformsOf(m)) > 1
	}
	for i, m := range ms {
		if _, dup := ix.pos[m.Module]; dup {
			errs = append(errs, fmt.Errorf("module %q listed twice", m.Module))
			continue
		}
		ix.pos[m.Module] = i
	}
	for i, m := range ms {
		for _, b := range m.Bases {
			j, ok := ix.pos[b]
			if !ok {
				errs = append(errs, fmt.Errorf("module %q: base %q is not in the plan", m.Module, b))
				continue
			}
			ix.bases[i] = append(ix.bases[i], j)
			ix.deps[j] = append(ix.deps[j], i)
			if !ms[j].State.done() {
				ix.remaining[i]++
			}
		}
	}
	order, cyclic := mesh.Topo(n, func(i int) iter.Seq[int] { return mesh.Indices(ix.bases[i]) },
		func(i int) iter.Seq[int] { return mesh.Indices(ix.deps[i]) })
	ix.topo = order
	if len(cyclic) > 0 {
		errs = append(errs, errors.New("bases form a cycle"))
		ix.topo = append(ix.topo, cyclic...)
	}
	ix.computeRanks(ms)
	if len(errs) > 0 {
		return ix, fmt.Errorf("%w: %w", ErrBadState, errors.Join(errs...))
	}
	return ix, nil
}

// computeRanks sets each module's remaining critical path: its estimate plus
// the longest remaining critical path of its dependents. A module without an
// estimate counts the mean of the known estimates, or 1 when none is known.
func (ix *index) computeRanks(ms []ModuleStatus) {
	var sum float64
	var known int
	for _, m := range ms {
		if m.Estimate > 0 {
			sum += m.Estimate.Seconds()
			known++
		}
	}
	def := 1.0
	if known > 0 {
		def = sum / float64(known)
	}
	ix.meanEst = def
	for k := len(ix.topo) - 1; k >= 0; k-- {
		i := ix.topo[k]
		est := def
		if e := ms[i].Estimate; e > 0 {
			est = e.Seconds()
		}
		longest := 0.0
		for _, d := range ix.deps[i] {
			longest = max(longest, ix.rank[d])
		}
		ix.rank[i] = est + longest
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

// SetEstimates sets the expected build durations that order asks (see the
// package doc); modules not in est keep theirs. Typically the durations of
// the modules' last builds.
func (s *State) SetEstimates(est map[string]time.Duration) {
	s.ensure()
	for i := range s.Modules {
		if d, ok := est[s.Modules[i].Module]; ok {
			s.Modules[i].Estimate = d
		}
	}
	s.ix.computeRanks(s.Modules)
}

// Rank is a module's remaining critical path in seconds of estimate (or in
// modules, without estimates): the order asks are released in.
func (s *State) Rank(module string) (float64, bool) {
	s.ensure()
	i, ok := s.ix.pos[module]
	if !ok {
		return 0, false
	}
	return s.ix.rank[i], true
}

// MeanEstimate is how long one of the plan's builds is expected to take,
// in seconds: the mean of its modules' estimates, 1 when none is known.
// The scheduler charges it to the plan's owner for each machine it gives.
func (s *State) MeanEstimate() float64 {
	s.ensure()
	return s.ix.meanEst
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

// Fill submits ready modules, best first, while the plan's window has
// room; without a window it submits every ready module; with a negative
// one, none. Start and Built
// fill by themselves; with a window the caller calls Fill after Started
// (and may after any event: it returns nothing when there is no room or
// nothing ready).
func (s *State) Fill(now time.Time) []Submit {
	s.ensure()
	if !s.Cancelled.IsZero() || s.Window < 0 {
		return nil
	}
	// Nothing ready, or no room: the census says so without a walk.
	if n := s.ix.census; n[Ready] == 0 || (s.Window > 0 && n[Queued] >= s.Window) {
		return nil
	}
	var ready []int
	queued := 0
	for i := range s.Modules {
		switch s.Modules[i].State {
		case Ready:
			ready = append(ready, i)
		case Queued:
			queued++
		}
	}
	if s.Window > 0 {
		room := max(0, s.Window-queued)
		if room < len(ready) && room > selectAtMost {
			// A wide window (the scheduler handing many machines at
			// once): sorting is cheaper than selecting.
			s.order(ready)
			ready = ready[:room]
		} else if room < len(ready) {
			// Select the best room modules in place: O(ready × room), which
			// is O(ready) for the small windows this is for, where sorting
			// every ready module on every event would not be.
			for k := range room {
				best := k
				for j := k + 1; j < len(ready); j++ {
					if s.compare(ready[j], ready[best]) < 0 {
						best = j
					}
				}
				ready[k], ready[best] = ready[best], ready[k]
			}
			ready = ready[:room]
		}
	}
	return s.submit(ready, now)
}

// selectAtMost is the widest room Fill selects the best ready modules for
// one by one; a wider one sorts them.
const selectAtMost = 8

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
		s.set(m, Building)
		s.dispatched = append(s.dispatched, m.Module)
	case m.State == Building && ev.At.After(m.Started) && ev.On != m.On:
	case m.State == Cancelling && m.Started.IsZero():
		// Taken by a holder just as the plan was cancelled: it stays
		// cancelling, and the machine is known.
	default:
		return false
	}
	m.On, m.Started, m.HandedBack = ev.On, ev.At, nil
	s.touch(ev.At)
	return true
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

// Cancel cancels the plan: every waiting or ready module is cancelled at
// once (failed and blocked ones keep their cause); every queued or building
// module becomes cancelling, and its ask id is returned (sorted) for the
// caller to withdraw from the queue and cut short on its holder. A
// cancelling module becomes cancelled when its holder reports (failed
// {cancelled}, or a built that came too late, see Built), when the caller
// withdrew its ask before any holder had it ([State.Withdrawn]), or when a
// bound passes ([State.ExpireCancelling]); until then the plan is running.
// Cancelling a settled or cancelled plan does nothing.
func (s *State) Cancel(now time.Time) (cancelAsks []string) {
	s.ensure()
	if !s.Cancelled.IsZero() || s.Settled() {
		return nil
	}
	s.Cancelled = now
	s.touch(now)
	for i := range s.Modules {
		m := &s.Modules[i]
		switch m.State {
		case Queued, Building:
			cancelAsks = append(cancelAsks, inFlightAsks(*m)...)
			s.set(m, Cancelling)
		case Waiting, Ready:
			s.set(m, Cancelled)
			m.Finished = now
		}
	}
	slices.Sort(cancelAsks)
	return cancelAsks
}

// Supersede settles, for the newer plan of the same repository and ref,
// every module of this plan that builds reports the newer plan builds too
// and that has not started (waiting, or ready: held for a machine) as
// superseded, SupersededBy newer, and with it every module waiting on a
// superseded one, transitively. A module in flight (queued or building)
// finishes; with cancel it becomes cancelling instead, its asks returned
// (sorted) for the caller to withdraw and cut short, and settles
// superseded when its holder stops (see Cancel; a built that arrives is
// not the plan's). It returns the modules superseded now, in plan order.
// A cancelled or settled plan, or a module already finished, is left
// alone.
func (s *State) Supersede(newer string, builds func(module string) bool, cancel bool, now time.Time) (superseded, cancelAsks []string) {
	s.ensure()
	if !s.Cancelled.IsZero() || newer == "" || newer == s.Plan {
		return nil, nil
	}
	mark := func(i int) {
		m := &s.Modules[i]
		s.set(m, Superseded)
		m.SupersededBy, m.Finished = newer, now
		superseded = append(superseded, m.Module)
	}
	for i := range s.Modules {
		m := &s.Modules[i]
		if !builds(m.Module) {
			continue
		}
		switch m.State {
		case Waiting, Ready:
			mark(i)
		case Queued, Building:
			if cancel {
				cancelAsks = append(cancelAsks, inFlightAsks(*m)...)
				s.set(m, Cancelling)
				m.SupersededBy = newer
				s.Superseding = now
			}
		}
	}
	for i := range s.Modules {
		if s.Modules[i].SupersededBy == newer {
			superseded = append(superseded, s.supersedeDown(i, newer, now)...)
		}
	}
	if len(superseded) > 0 || len(cancelAsks) > 0 {
		s.touch(now)
	}
	slices.SortFunc(superseded, func(a, b string) int { return s.ix.pos[a] - s.ix.pos[b] })
	slices.Sort(cancelAsks)
	return superseded, cancelAsks
}

// supersedeDown settles superseded every module waiting, transitively, on
// module i (superseded, or to be): its base will not be built in this
// plan. It returns them.
func (s *State) supersedeDown(i int, newer string, now time.Time) (out []string) {
	queue := []int{i}
	for k := 0; k < len(queue); k++ {
		for _, d := range s.ix.deps[queue[k]] {
			dm := &s.Modules[d]
			if dm.State != Waiting {
				continue
			}
			s.set(dm, Superseded)
			dm.SupersededBy, dm.Finished = newer, now
			out = append(out, dm.Module)
			queue = append(queue, d)
		}
	}
	return out
}

// Cancelling returns the ask ids of the cancelling modules, sorted: after
// a reload the caller asks their holders again to stop.
func (s *State) Cancelling() []string {
	var out []string
	for _, m := range s.Modules {
		if m.State == Cancelling {
			out = append(out, inFlightAsks(m)...)
		}
	}
	slices.Sort(out)
	return out
}

// Withdrawn records that a cancelling module's ask was taken out of the
// queue before any holder received it: nothing works on it, so it is
// cancelled. It reports whether the state changed (not for another ask, or
// one a holder announced started).
func (s *State) Withdrawn(ask string, now time.Time) bool {
	s.ensure()
	for i := range s.Modules {
		m := &s.Modules[i]
		for k := range m.Platforms {
			if p := &m.Platforms[k]; p.Ask == ask && m.State == Cancelling && p.State == Queued {
				p.State = Cancelled
				s.platformStopped(m, "", "", "withdrawn from the queue before any holder took it", now)
				return true
			}
		}
		if m.Ask == ask && m.State == Cancelling && m.Started.IsZero() {
			s.stopped(m, "", "", "withdrawn from the queue before any holder took it", now)
			return true
		}
	}
	return false
}

// ExpireCancelling cancels the modules still cancelling bound after the
// plan was cancelled (their holder died, or never heard): it returns them.
func (s *State) ExpireCancelling(now time.Time, bound time.Duration) []string {
	since := s.Cancelled
	if since.IsZero() || (!s.Superseding.IsZero() && s.Superseding.Before(since)) {
		since = s.Superseding
	}
	if since.IsZero() || now.Sub(since) < bound {
		return nil
	}
	var out []string
	for i := range s.Modules {
		m := &s.Modules[i]
		if m.State == Cancelling {
			s.stopped(m, "", "", fmt.Sprintf("no word from its holder %s after the cancel", bound), now)
			out = append(out, m.Module)
		}
	}
	return out
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

// Settled reports whether nothing can progress any more: no module waiting,
// ready, queued, building or cancelling. (Failed and blocked modules wait for
// a Retry, which un-settles the plan.)
func (s *State) Settled() bool { return s.Counts().inFlight() == 0 }

// Finished counts the modules that have their result (ModuleState.Finished).
func (c Counts) Finished() int {
	return c.Built + c.Unchanged + c.Failed + c.Blocked + c.Cancelled + c.Superseded
}

// inFlight counts the modules that can still progress.
func (c Counts) inFlight() int { return c.Waiting + c.Ready + c.Queued + c.Building + c.Cancelling }

// Counts counts the modules in each state.
func (s *State) Counts() Counts {
	s.ensure()
	n := s.ix.census
	return Counts{
		Total: len(s.Modules), Waiting: n[Waiting], Ready: n[Ready], Queued: n[Queued], Building: n[Building],
		Built: n[Built], Unchanged: n[Unchanged], Failed: n[Failed], Blocked: n[Blocked],
		Cancelling: n[Cancelling], Cancelled: n[Cancelled], Superseded: n[Superseded],
	}
}

// Outcome is the plan's result: running until settled; then cancelled if it
// was cancelled, built if every module is built (or unchanged, or
// superseded), failed otherwise. An empty plan is built.
func (s *State) Outcome() Outcome {
	c := s.Counts()
	switch {
	case c.inFlight() > 0:
		return OutcomeRunning
	case !s.Cancelled.IsZero():
		return OutcomeCancelled
	case c.Built+c.Unchanged+c.Superseded == c.Total:
		return OutcomeBuilt
	default:
		return OutcomeFailed
	}
}

// current finds the module an event is about, if the event names its
// current ask (and this plan).
func (s *State) current(plan, module, ask string) (int, bool) {
	s.ensure()
	if plan != "" && plan != s.Plan {
		return 0, false
	}
	i, ok := s.ix.pos[module]
	if !ok || ask == "" || s.Modules[i].Ask != ask {
		return 0, false
	}
	return i, true
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
		m.On, m.Reason, m.Message, m.Log, m.BlockedBy = "", "", "", nil, ""
		m.Commit, m.Digest, m.Image, m.Reuses, m.Waiting = "", "", "", "", ""
		m.Attestations = nil
		s.askPlatforms(m)
		out[k] = s.submitOf(i)
	}
	s.touch(now)
	return out
}

// order is the release policy: descending remaining critical path, then
// tier, then name.
func (s *State) order(ms []int) { slices.SortFunc(ms, s.compare) }

// compare orders two modules by the release policy.
func (s *State) compare(a, b int) int {
	ra, rb := s.ix.rank[a], s.ix.rank[b]
	switch {
	case ra > rb:
		return -1
	case ra < rb:
		return 1
	case s.Modules[a].Tier != s.Modules[b].Tier:
		return s.Modules[a].Tier - s.Modules[b].Tier
	}
	return strings.Compare(s.Modules[a].Module, s.Modules[b].Module)
}

func (s *State) submitOf(i int) Submit {
	m := s.Modules[i]
	sub := Submit{Plan: s.Plan, Module: m.Module, AskID: m.Ask, Attempt: m.Attempt, Source: m.Source, Key: m.Key}
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

// maxAskID is the longest ask id the build seat accepts.
const maxAskID = 128

var askIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// AskID derives the id of a module's ask in a plan: planID-module-attempt
// (e.g. "p-1a2b3c4d5e6f-runtime-1"). It is deterministic, so an ask
// re-published after a restart is deduplicated by the bus, and a retry (a
// new attempt) is a new ask. It has no dots and is 1-128 of [A-Za-z0-9_-];
// an id that would not be (an over-long module name) is cut and suffixed
// with a hash of the whole.
func AskID(planID, module string, attempt int) string {
	id := planID + "-" + module + "-" + strconv.Itoa(attempt)
	if askIDRE.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	suffix := "-" + hex.EncodeToString(sum[:8])
	b := []byte(id)
	for k, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[k] = '_'
		}
	}
	if len(b) > maxAskID-len(suffix) {
		b = b[:maxAskID-len(suffix)]
	}
	return string(b) + suffix
}

// Current is a module's current image and the plan that built it.
type Current struct {
	Module string `json:"module"`
	Digest string `json:"digest"`
	Image  string `json:"image,omitempty"`
	Commit string `json:"commit,omitempty"`
	Plan   string `json:"plan"`
	// Seq is the plan's sequence number.
	Seq uint64 `json:"seq"`
	// Created is the plan's creation time.
	Created time.Time `json:"created"`
	// Inputs are the components of the input key it was built from.
	Inputs *KeyInputs `json:"inputs,omitempty"`
}

// Newer reports whether a may replace b as a module's current image: a's
// plan has a higher sequence number, or the same and a later creation time.
// A zero b is replaced by anything with a sequence or a time; equal plans
// replace nothing.
func Newer(a, b Current) bool {
	if a.Seq != b.Seq {
		return a.Seq > b.Seq
	}
	return a.Created.After(b.Created)
}

// Current returns a built module's result as a candidate current image.
func (s *State) Current(module string) (Current, bool) {
	m, ok := s.Module(module)
	if !ok || !m.State.done() {
		return Current{}, false
	}
	return Current{Module: m.Module, Digest: m.Digest, Image: m.Image, Commit: m.Commit, Plan: s.Plan,
		Seq: s.Seq, Created: s.Created, Inputs: m.Inputs}, true
}

// done reports whether a module in state st has its image: built, or
// unchanged.
func (st ModuleState) done() bool { return st == Built || st == Unchanged }

// Inputs address a module's build context: the full commit its source
// resolved to and the git tree id of its context path at it.
type Inputs struct {
	Commit string `json:"commit"`
	Tree   string `json:"tree"`
}

// Address records where each module's build context comes from, by module
// (modules not in inputs, or with an empty tree, stay unaddressed: they
// have no input key and are always submitted). A module's source commit
// becomes the resolved one, so that its ask builds what its key names.
// Call it before Start.
func (s *State) Address(inputs map[string]Inputs) {
	for i := range s.Modules {
		m := &s.Modules[i]
		in, ok := inputs[m.Module]
		if !ok || in.Tree == "" {
			continue
		}
		m.Tree = in.Tree
		if in.Commit != "" {
			m.Source.Commit = in.Commit
		}
	}
}

// SetKnown sets how the state learns whether an input key was built
// before (nil: never). It is not persisted: set it again after a reload.
func (s *State) SetKnown(known func(key string) (KeyRecord, bool)) { s.known = known }

// Reused returns the modules settled unchanged since it was last called,
// in the order they settled: the caller records them (their current
// image) as it does built modules.
func (s *State) Reused() []string {
	out := s.reused
	s.reused = nil
	return out
}

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

// keyOf is module i's input key, "" when its build context is not
// addressed.
func (s *State) keyOf(i int) string {
	m := s.Modules[i]
	if m.Tree == "" {
		return ""
	}
	bases := make(map[string]string, len(s.ix.bases[i])+len(m.External))
	for _, b := range s.ix.bases[i] {
		bases[s.Modules[b].Module] = s.Modules[b].Digest
	}
	for _, b := range m.External {
		bases[b] = s.External[b]
	}
	// A module of several platforms is one output, its index: its key
	// names every platform (one platform's key is that platform's).
	platform := strings.Join(m.Source.Platforms, ",")
	return InputKey(m.Module, platform, m.Tree, m.Source.Path, m.Source.Dockerfile, bases)
}

// InputKey is the input key of a build: a hash of the module, its platform,
// the git tree id of its build context, the context path and Dockerfile,
// and the digest of every base by module. Anything that could change the
// image changes the key; a commit that leaves the context alone does not.
// It is 64 hex digits.
func InputKey(module, platform, tree, path, dockerfile string, bases map[string]string) string {
	h := sha256.New()
	field := func(k, v string) { fmt.Fprintf(h, "%s %d:%s\n", k, len(v), v) }
	field("key", "v1")
	field("module", module)
	field("platform", platform)
	field("tree", tree)
	field("path", path)
	field("dockerfile", dockerfile)
	for _, b := range slices.Sorted(maps.Keys(bases)) {
		field("base "+b, bases[b])
	}
	return hex.EncodeToString(h.Sum(nil))
}
