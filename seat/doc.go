// Package seat is what the mesh's seat controllers share: cascade's build
// controller and deploy's fleet controller (and its nodes) are each one
// goroutine that owns its state and works three inputs the same way.
//
// Vocabulary:
//
//   - A consumption ([Consume]) reads a durable pull consumer — a seat's
//     work queue, the events stream, a node's declarations — onto a
//     channel. A missed heartbeat (a cluster without quorum, a bus away for
//     a while) is a pause: it is logged and the pull goes on; only the
//     consumer's end closes the channel. Stopping a consumption hands back
//     at once (naked) what was fetched and not worked, so the next holder
//     has it without an ack wait.
//   - An inbox ([Inbox]) is how a request from another goroutine reaches
//     the owner: [Inbox.Do] sends it and waits for the owner's answer, or
//     for the caller's context.
//   - A tool ([Tool]) is a request/reply subject a controller serves:
//     [Serve] decodes each request and hands it to the owner with a time
//     bound; [Call] is the client, with a default time bound when the
//     caller's context has none ([WithTimeout] changes it).
//   - A code table ([Codes]) names the sentinel errors that cross the wire
//     in a reply. It is ordered: an error's code is the first entry whose
//     first sentinel it wraps, so an error wrapping two sentinels has one
//     code, always the same; the client's [Error] matches every sentinel of
//     its code with errors.Is.
//   - A controller's bucket ([OpenBucket]) is the key-value bucket its
//     module declares as state, named by mesh.KVBucket; the module is the
//     holder of the controller seat that declares it ([ControllerModule]).
//
// Example: the fleet controller serves its tools with
//
//	subs, err := seat.Serve(nc, tools, 30*time.Second, func(ctx context.Context, tool string, req Request) Reply {
//		r, err := c.cmds.Do(ctx, command{kind: tool, req: req})
//		...
//	}, malformed)
//
// and `builds nodes` calls one of them with seat.Call.
package seat
