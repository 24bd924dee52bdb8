// Package mesh is the declaration model: the manifests modules are
// declared in, the checks a catalogue of them must pass, and the one
// derivation of every name on the wire from what they declare.
//
// # What a manifest says
//
// A module is one YAML file, <module>.yaml, in a catalogue directory. It
// names things locally and never spells a subject, stream, consumer or
// bucket: the mesh derives those, each by exactly one function, so that
// the stream, the consumer, the permission and the subscriber cannot drift
// apart.
//
//   - A module is a program the mesh knows: module: build-controller. Names
//     are lowercase letters, digits and '-' (ValidName).
//   - A seat is a role with a protocol, declared by one module under seats:
//     the verbs it accepts (a work queue, each verb with how long its
//     backlog survives: "build retain 7d"), the events it emits and the
//     tools it serves. Its scope is node (every node may hold it) or mesh.
//   - A holder is a module that holds a seat: the one that declares it, or,
//     for the mesh's own seats (MeshSeats: mesh-git, mesh-controller), a
//     module assigned with holds: [mesh-git]. A module never declares a
//     mesh-* seat.
//   - emits are the module's own events, serves its own tools
//     (request/reply).
//   - uses names seats the module submits work to: it publishes on their
//     accepts and nothing else.
//   - consumes names events it hears, as <emitter>.<event>, the emitter a
//     module or a seat: mesh-git.pushed, node-build-agent.built.
//   - state names buckets the module owns and writes; reads names others'
//     buckets, as <module>.<bucket>, read-only.
//
// Events are dotted names (order.placed). In emits and consumes, * stands
// for one name and ** for the rest: log.* is every log.<id>, shop.** every
// event of shop (ValidEvent).
//
// # What the mesh derives
//
//	declared                       derived
//	module m emits e               subject mesh.mod.<m>.event.<e>, kept in stream EVENTS
//	module m serves t              request/reply on mesh.mod.<m>.tool.<t>, no stream
//	seat s accepts v               subject mesh.seat.<s>.accept.<v>, kept in stream SEAT_<s>
//	seat s emits e                 subject mesh.seat.<s>.event.<e>, kept in EVENTS
//	seat s serves t                request/reply on mesh.seat.<s>.tool.<t>
//	an event log or log.*          kept in stream LOGS (bounded by size), not EVENTS
//	holders of seat s              one durable pull consumer, holders-<s>, on SEAT_<s>
//	                               (an ask delivered HolderMaxDeliver times is given up,
//	                               announced on $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.…,
//	                               kept in stream GAVEUP_<s> for the controller's consumer
//	                               holders-mesh-controller, for a seat the controller uses)
//	holders of seat s claim asks   key-value bucket ASKS_<s>, one key per ask id
//	module m consumes …            durable consumer module-<m> on EVENTS (and on LOGS for log events)
//	module m, state b              key-value bucket <m>_<b> (stream KV_<m>_<b>)
//	a holder's claim of seat s     key <s>.mesh or <s>.node.<node> in bucket CLAIMS
//	wildcards * and **             * and > on the wire
//
// The functions are ModuleEventSubject, ModuleToolSubject,
// SeatAcceptSubject, SeatEventSubject, SeatToolSubject, EventStream,
// SeatStream, SeatConsumer, ModuleConsumer, AckSubject, KVBucket,
// ClaimsBucket, ClaimKey, AskClaimsBucket, AskClaimKey, MaxDeliveriesAdvisory, GaveUpStream, GaveUpConsumer and WireName. Local names hold no dots where a token is expected and no "_",
// so two declarations cannot derive the same name.
//
// # What is refused
//
// Load reads a catalogue and Check checks manifests in memory; each returns
// every Problem at once — file, line, field and what to write instead — and
// a catalogue with any problem that is not a warning is refused:
//
//   - a name that is not one, an unknown key, a value of the wrong kind;
//   - an event that repeats its module's name (write order.placed, not
//     shop.order.placed) or reads as another module's or seat's;
//   - a mesh-* seat declared under seats (write holds: [mesh-git]), holds
//     naming anything but one of the mesh's own seats;
//   - a seat declared by two modules, a module declared twice;
//   - a verb, event or tool named after a token of the derivation
//     (ReservedTokens), a scope other than node or mesh, an accepts entry
//     that is not VERB or VERB retain DURATION (ParseAccept, ParseRetain),
//     a bucket's history outside 1 to 64 or a ttl that is not a duration
//     (ParseTTL);
//   - any string spelled as the wire spells it: mesh.…, $JS.…, $KV.…,
//     _INBOX.…, or > and # as wildcards (write **);
//   - a build without repo, a path or Dockerfile outside the repository, a
//     platform not os/arch[/variant], build.on naming a module that does
//     not exist or has no build, or a cycle (printed as a → b → a);
//   - a consumes of an emitter in the catalogue that does not emit the
//     event, wildcards matched on both sides; a reads of a bucket its owner
//     does not declare.
//
// An emitter or owner that is not in the catalogue is not an error: it may
// be installed later. A uses of a seat no module declares is a warning:
// work submitted to it queues until a holder comes.
//
// # An example
//
// The build agent declares the seat every build machine holds:
//
//	module: build-agent
//	seats:
//	  - seat: node-build-agent
//	    scope: node
//	    accepts: [build retain 7d]
//	    emits: [started, built, failed, log.*]
//	    serves: [status]
//
// and the controller submits work to it and follows its reports:
//
//	module: build-controller
//	holds: [mesh-controller]
//	uses: [node-build-agent]
//	consumes: [mesh-git.pushed, node-build-agent.built, node-build-agent.failed]
//	state: [{name: plans, history: 1}]
//
// From these the mesh derives the work queue SEAT_node-build-agent on
// mesh.seat.node-build-agent.accept.build.linux-amd64 (one subject per
// platform the catalogue builds for, exactly its consumers' filters),
// keeping an ask for 7 days; the agents' shared consumer
// holders-node-build-agent-linux-amd64 (with `shards: N` on the seat, N
// subjects and consumers a platform, shard k ≥ 1 suffixed ".s<k>" and
// "-s<k>": shard.go); the events
// mesh.seat.node-build-agent.event.built (in EVENTS) and
// mesh.seat.node-build-agent.event.log.<ask> (in LOGS); the controller's
// consumer module-build-controller on EVENTS, filtering
// mesh.seat.mesh-git.event.pushed and the two agent events; and its bucket
// build-controller_plans. Writing mesh.seat.node-build-agent.event.built in
// consumes instead is refused: "names are local, write
// node-build-agent.built".
//
// # The build seat's events
//
// A holder of the build seat speaks only on its own subjects
// (HolderEventSubject: mesh.seat.node-build-agent.on.<machine>.event.<e>),
// each payload versioned (DecodeEvent): Started when it begins an ask,
// then one outcome, Built or Failed; and HandedBack (handed-back), a note
// that is not an outcome, when it gives the ask back to the queue — for a
// retry after a delay (Next: when it is due again), or because the
// machine cannot build (Sick) — with why, and since when the ask has
// failed on infrastructure (InfraSince, the start of its --retry-for
// budget). The farm's catalogue declares it (farm/build-agent.yaml emits
// it, farm/build-controller.yaml consumes it); the controller shows it on
// the module ("retrying (attempt 3: …; next in 40s)", "waiting: no
// healthy machine (…)") until the ask's next Started or outcome.
package mesh
