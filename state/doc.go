// Package state is the state surface a module reaches through the node
// runtime (ADR 0201): the key-value buckets it was issued with its
// assignment, by the names the module itself uses for them.
//
// A module declares the state it owns under state (by local name, "plans")
// and the state of others it reads under reads ("build-agent.builds"). Each
// assignment is issued those buckets (mesh.IssuedBucket): its own state
// read-write, its reads read-only. The runtime serves get, put, delete, keys
// and watch from that list and refuses, with the reason and a sentinel error
// matched with errors.Is, a bucket the module was not issued (ErrNotIssued)
// and a write to one it only reads (ErrReadOnly). The server enforces only
// the union of what a node's modules may do, and a write it refuses surfaces
// to a client as a timeout, so the runtime's refusal is what a module sees.
//
// Limits: at most 256 KiB a value (ErrValueTooLarge) and 64 MiB a bucket
// (ErrBucketFull); one value per key and no expiry unless the owner's
// declaration says otherwise (history, ttl). No secret is stored in a
// bucket: a JSON value with a field whose name says it is a credential —
// password, secret, token, private key, API key and the like, at any depth,
// in any case or separator (apiKey, API_KEY, api-key, client_secret) — is
// refused naming the field (ErrCredential). A value that needs a secret
// names it; the secret travels on request/reply.
//
// A watch delivers the current values first (no deletions), then one event
// of kind Current (the end-of-current marker), then every change —
// deletions included — until it is stopped:
//
//	w, err := st.Watch(ctx, "builds")
//	if err != nil { ... }
//	defer w.Stop()
//	for ev := range w.Events() {
//		switch ev.Kind {
//		case state.Value:   // a key's value, current or changed
//		case state.Current: // everything current has been delivered
//		case state.Deleted: // a key was deleted
//		}
//	}
//
// A module the runtime carries in-process finds its surface in its context
// (FromContext). A module the apply hook starts out of process reaches the
// same surface on a unix socket under the node's state directory, one per
// module in a directory only the node's user may enter
// (MESHBUILD_STATE_SOCKET names it; see Serve and Dial for the protocol).
package state
