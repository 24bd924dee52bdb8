// Package claim keeps one holder per seat and scope (design 29 §5): a holder
// claims its seat before it pulls, and nobody else can until the claim is
// released or lapses.
//
// # Vocabulary
//
// A seat is held at a scope. A mesh-scoped seat (mesh-controller) has one
// holder in the whole mesh; a node-scoped seat (node-build-agent) has one
// holder per node. Scope is Mesh() or Node(name).
//
// A claim is one key in the mesh's claims bucket (mesh.ClaimsBucket), named
// by mesh.ClaimKey: "mesh-controller.mesh", "node-build-agent.node.m1". Its
// value is a Record: the holder, since when it holds the seat, and its
// lease. A claim is created only if the key is absent (KeyValue Create); a
// second claimant is refused with a *ClaimedError, which matches ErrClaimed
// with errors.Is and names the holder and since when.
//
// A Lease is the handle of a claim that succeeded. It renews the claim every
// third of the lease, each renewal conditional on the revision it last
// wrote, and each carrying the lease as the key's TTL: the server forgets a
// claim whose holder stopped renewing (it died, or lost the bus) one lease
// after its last renewal, and leaves a marker a waiting claimant sees. A
// holder whose renewal is refused (someone else holds the key now) or that
// has not renewed for a whole lease closes Lost and must stop working: it
// can no longer tell that it is the only holder. A claim made WithResume (a
// node's build agent, the one contender for its seat) is not lost to a
// lapse: it is written again under its own token once the bus answers,
// the key created only if absent, and only another claim on it loses it.
//
// An ask claim (ask.go) is the same lease on one ask: a machine's own key
// in its seat's ask claims bucket (mesh.AskClaimKey, "<ask>.<machine>"),
// written with the lease as its TTL and bound to the machine's seat claim
// (its token): void the moment that seat claim lapses or is released. A
// holder settles it when done — the outcome recorded before it is
// announced (Announce), or handed back with the ask's infrastructure
// budget so far (Release) — and those records outlive it, for whoever takes
// the ask next (Asks.Look). One lease mechanism, on the server's clock: no
// holder's clock decides whether a claim is alive (WithClock sets only the
// times a record shows people).
//
// Standby waits for a seat held by another and takes it when the holder
// releases it or its claim lapses; Hold runs a function as the holder, stops
// it when the claim is lost, and stands by again.
//
// # Example
//
// The controller takes mesh-controller, waiting as a standby while another
// controller holds it:
//
//	err := claim.Hold(ctx, js, "mesh-controller", claim.Mesh(), "build-controller on host-a pid 812",
//		func(ctx context.Context) error { return controller.Run(ctx) },
//		claim.WithLease(15*time.Second), claim.WithLogger(log))
//
// A build agent claims its node's seat once and is refused if the machine
// already has one:
//
//	lease, err := claim.Claim(ctx, js, "node-build-agent", claim.Node("m1"), "build-agent on host-a pid 913")
//	if errors.Is(err, claim.ErrClaimed) { … } // names the holder and since when
//	defer lease.Release(context.WithoutCancel(ctx))
//
// The package logs nothing unless given a logger (WithLogger).
package claim
