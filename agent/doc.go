// Package agent is the build agent: a holder of the build seat
// (node-build-agent) that pulls asks from the seat's work queue, builds
// each with BuildKit, pushes the image by digest and announces the outcome.
//
// # The holder loop
//
// Every holder of the seat shares one durable pull consumer on the seat's
// work queue (mesh.SeatStream, mesh.SeatConsumer). An Agent runs Slots
// slots (one by default); each slot does, over and over:
//
//  1. Fetch one ask — only when idle, so a busy machine is never handed
//     work and an ask waits in the queue for the first machine free.
//  2. Decode it (mesh.DecodeAsk) or refuse it: an ask that cannot be read,
//     or names a module the catalogue does not build, is announced
//     failed{ask} once and terminated, never redelivered. An ask for a
//     platform this machine does not build is handed back for one that
//     does.
//  3. Work it: announce started, then the Worker checks the commit out and
//     builds it (BuildWorker: Sources, then BuildKit), while the slot
//     heartbeats the ask (InProgress) every third of the consumer's ack
//     wait — builds outlast any ack wait, and an agent that dies stops
//     heartbeating, so its ask goes to another.
//  4. Decide one outcome (Outcome) and settle it: announce, then settle the
//     ask's message, then count (Observer) and log.
//
// The outcomes, what is announced on the seat's events and what becomes of
// the ask:
//
//	outcome       announced              the ask                 when
//	built         built{digest, image}   acknowledged            pushed and verified
//	failed        failed{reason, log}    terminated              source, build, push, ask, cancelled;
//	                                                             infra past Config.RetryFor
//	retried       handed-back{next}      redelivered after a     infra within Config.RetryFor
//	                                     growing delay
//	handed-back   nothing (handed-back   redelivered at once     the agent is stopping, the platform
//	              {sick} when the        (or after a delay)      is not built here, the machine is
//	              machine is sick)                               sick, another holder's claim is
//	                                                             alive, or an outcome could not be
//	                                                             announced
//	already-done  the recorded outcome,  acknowledged (failed:   a claim says its outcome was
//	              under its message id   terminated)             recorded: announced again, not built
//
// Before it builds, a slot claims the ask under this machine's own key in
// the seat's ask claims bucket (claim.Asks: the claim package's lease, the
// key's TTL on the server's clock, bound to the machine's seat claim). A
// redelivered ask whose claim is alive elsewhere is left to its holder.
// Before an outcome is announced it is recorded in the claim with its
// message id (unguessable until then); whoever takes the ask after this
// holder died, or gave it back unannounced, announces the recorded outcome
// again under the same id — the stream keeps it once — instead of building
// it again. Events go on this machine's own subjects
// (mesh.HolderEventSubject), which only its credentials may publish on, and
// a publish the stream takes as a duplicate of another principal's event
// is published again under a fresh id.
//
// An outcome is announced before its ask is settled, and one that cannot
// be announced is not settled: nothing acknowledged is ever unannounced.
//
// # Failures, cancel and stop
//
// Every error a Worker returns wraps one class — ErrSource, ErrBuild,
// ErrPush or ErrInfra — and Classify names the reason a failed carries.
// What a build's failure is, by its cause (a registry's 5xx, 429 or full
// disk: infrastructure; its 4xx refusal: the push's; a RUN that exited:
// the build's), one ordered table decides: causes, in errors.go.
// The first three are deterministic and reported once; an infrastructure
// failure is retried with a delay that doubles from Config.RetryDelay up to
// Config.MaxRetryDelay, and reported at the first failure more than
// Config.RetryFor after the ask's first (kept in its claim, on whatever
// machine). A failure that is the machine's — its BuildKit or its registry
// does not answer (Prober) — sends the ask back at once, and the machine
// stops pulling, probing with backoff until it answers (Status.Health says
// unhealthy, and why). The ask's budget is spent all the same: every
// hand-back records in the ask's claim since when it has failed and why.
// Between two probes a sick machine takes at most one ask, without
// building it, when no other machine is there to take it (no pull waits on
// the queue, no holder of the platform answers the seat's status tool
// healthy): failed{infra} "no healthy machine: <why> (since T), more
// than --retry-for 5m" once its budget is gone, else handed back at once
// (no delay: a healthy machine may take it). So an ask settles within its
// budget (plus a probe interval, at most RetryFor/20) even when every
// machine is sick, and a healthy machine is never slowed.
//
// A retry, and a sick machine's hand-back, are announced (after the claim
// is settled as released) as handed-back{why, infra_since, next, sick}: a
// note the controller shows on the module (`retrying (attempt 3: …; next
// in 40s)`, `waiting for a healthy machine (given back by vm-x: …)`), not
// an outcome.
//
// A cancelled plan's asks are cut short through the seat's cancel tool
// (mesh.CancelTool; Agent.Cancel): the build's context is cancelled, the
// agent announces failed{cancelled} and terminates the ask. A build
// cancelled is never announced built, even one that finished as the cancel
// came; a cancel that comes after the outcome was decided is answered "not
// mine".
//
// When Run's context is done the agent fetches nothing more, lets the
// builds in hand finish within Config.Grace (built and acknowledged as
// usual), and hands back any still running so another machine takes it at
// once rather than after the ack wait.
//
// # A worked example
//
// Machine m1 holds the seat with one slot; the queue holds ask a1 (module
// app, plan p1, base runtime pinned to sha256:1a…):
//
//	m1 fetches a1                  the consumer: 1 ack pending, 0 waiting
//	m1 announces started{a1, on m1, attempt 1}
//	m1 checks out the commit, solves app's Dockerfile with
//	  context:runtime = docker-image://<registry>/runtime@sha256:1a…,
//	  pushes <registry>/app by digest and resolves it: sha256:7c…
//	  (output on log.a1 in batches; InProgress every 10 s)
//	m1 announces built{a1, digest sha256:7c…, image <registry>/app@sha256:7c…}
//	m1 acknowledges a1             the consumer: empty; m1 fetches again
//
// Had the registry been down, m1 would have given a1 back (retried) to be
// delivered again — to m1 or any other machine — after RetryDelay, then
// 2×RetryDelay, …; had a RUN failed, it would have announced
// failed{a1, reason build, the last lines of output} and terminated a1.
//
// # Wiring
//
// New takes a validated Config (DefaultConfig, Validate), a JetStream
// handle, a Worker and, optionally, a logger and an Observer (the metrics
// package's Agent). Run holds the seat until its context is done; Status
// and AskStatus answer the seat's status tool.
package agent
