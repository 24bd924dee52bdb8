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
// modules); ties go to the lower tier, then the name. A module held ready
// loses half the time it has waited from its rank (Aging), so that at first
// sight one with a short path is not held behind every longer path to the
// end: its duration is a guess, and may be the plan's longest.
//
// The work queue is first in, first out, so ordering each batch helps
// little on a deep plan: what is already queued goes first. With a
// [State.Window] the controller holds released asks (state ready) and keeps
// at most Window of the plan's asks queued; whenever a holder starts one
// ([State.Started], then [State.Fill]) the best held ask is published, so
// the next idle machine takes the module holding up most of the plan. The
// simulator (Simulate in package cascade/sim; simstate_test.go runs State
// through it) measures a 1,000-module plan on 50 machines at 1.08× the
// lower bound with no window and 1.004× with a window of 1 and duration
// estimates (1.02× with a window of 5). A State's Window 0 publishes
// everything at once (the controller's default is WindowIdle, see
// Config.Window).
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
// # The controller's batch loop
//
// [Controller] owns every plan's State on one goroutine ([Controller.Run],
// controller.go). Each turn of its loop takes what woke it, changes the
// states in memory, and makes the change durable and visible before it
// acknowledges anything:
//
//	Run: waits on the events, the tools, the given-up asks and a tick
//	 ├─ work, event (events.go)  a batch of outcomes, fenced (fence.go), applied to State
//	 ├─ command (tools.go)       rebuild, retry, cancel, priority, catalogue
//	 └─ tick (controller.go)     bounds (bounds.go), platforms unserved, image indexes (platforms.go)
//	 ▼
//	touch, enqueue (flush.go)    the plans and modules changed, the asks released
//	 ▼
//	flush                        fills the windows (dispatch.go), then, retried up to StoreRetryFor:
//	 ├─► persist                 modules, current images, estimates, then plan records, in phases
//	 ├─► publish                 the asks of the plans stored, to the build seat (message id = ask id)
//	 └─► settle                  settled plans handed to the Settler (deployment); old plans pruned
//	 ▼
//	ack the batch, back to Run
//
// The flush's phases: of what finished, the bases of its first asks
// (firstAsks, the best ranked); those asks' modules, stored queued, and
// the asks published; the rest of what finished (other modules, current
// images, estimates); the rest it released, and their asks; then the
// modules still waiting, if no more than waitingPerFlush, and the plan
// records. A big plan's modules still waiting are stored beside the loop,
// waitingPerFlush at a time, the deepest tiers first, the next share
// spareEvery after the last is stored (someWaiting, sharewrite.go): the
// loop goes on meanwhile, and stores a module of the share in flight again
// only once the share is stored. A module not stored is loaded as waiting
// after a restart.
//
// One change waits: a started alone is applied at once but stored with
// its module's next change (a short build's built) or StartedStoreDelay
// later, whichever comes first, and acknowledged once stored
// (startedwrite.go): a fully cached build is one write of its module, not
// two. A write the store refuses keeps its plan's asks unpublished and its
// events unacknowledged until a later flush stores it; after a restart
// (resume.go) the stored plans are loaded, the events since their last
// save replayed, and their pending asks published again (deduplicated by
// ask id). Plans are made in create.go; input keys and early cutoff are in
// cutoff.go, the ranking index in rank.go, ask ids in ids.go, the newer
// plan's image in current.go.
//
// A State is not safe for concurrent use: the controller serialises the
// events of a plan.
package cascade
