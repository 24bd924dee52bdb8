// Package deploy is the fleet: machines enrol, modules are assigned to them,
// and deployment is state (design 29 §5–§6, ADR 0121, ADR 0190 §5).
//
// A node is one machine running the node runtime (cmd/mesh-node). It enrols
// with the mesh-controller seat — name, machine identity, platforms, and the
// address the controller answers at, in the payload, because a work-queue
// message keeps no reply subject. The controller records the node and creates
// its consumer: named after the node, filtered to the node's subject on the
// NODES stream, no max-deliver, a five-minute ack wait.
//
// An assignment puts a module on nodes (`builds assign build-agent m1 m2`).
// When an assignment changes, or a plan settles with a new digest for an
// assigned module, the controller composes each affected node's declaration —
// a revision, and per module its image by digest and the seats it holds — and
// publishes it as state: one message per node subject, the last one only, so
// a node that was away reads exactly the current declaration.
//
// The node applies the newest declaration and refuses one at or below the
// revision it applied (kept in its state directory): it pulls each image by
// digest into a local OCI image layout and verifies it, runs the site's apply
// hook, and starts in-process the modules it carries (build-agent), stopping
// them — handing their work back — when they are unassigned. It reports
// applied, failed or refused to the seat's report verb, and only then
// acknowledges the declaration; heartbeats go the same way.
//
// The controller hears reports through a store window: a report is recorded
// and leaves the queue; one the store cannot take is delivered again after a
// delay until a bound (from when it was published) passes, and then let go,
// logged and counted; one about a superseded declaration is settled without
// action; a heartbeat is heard and nothing is persisted.
package deploy
