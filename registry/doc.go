// Package registry holds what meshbuild knows about OCI registries: the
// client every component speaks to a registry with, resolving references
// to digests, telling a registry that is down from one that refuses, the
// embedded registry of the default setup, and the busybox base image that
// tests and the demo build on.
//
// # References and digests
//
// An image is named by a repository ("127.0.0.1:5000/runtime") and either a
// tag ("…/runtime:latest") or a digest ("…/runtime@sha256:…"). Tags move;
// digests do not. meshbuild pushes every image under the tag latest, so
// that a person or a FROM line outside the mesh finds the newest build, but
// announces and consumes it only by digest: a dependent is always built on
// the base digest its ask names, whatever latest points at by then.
// [Client.Resolve] turns any reference into the digest of its manifest.
//
// # The client
//
// A [Client] is made once from options, in the manner of
// go-containerregistry's remote.Option, and handed to whatever speaks to a
// registry (the agent's verification of a push, the controller's lookup of
// a base's latest digest):
//
//	c := registry.NewClient(registry.WithInsecure(true))
//	d, err := c.Resolve(ctx, "registry.example:5000/runtime:latest")
//
// Credentials come from the docker config keychain by default
// ([WithKeychain]), the same file BuildKit's pushes read, so a registry
// that needs a login answers the client as it answers the push. Registries
// on loopback or private addresses are spoken to over plain HTTP
// (go-containerregistry's rule for such hosts); [WithInsecure] extends that
// to any host and skips TLS verification. A nil *Client is the default one.
//
// # Errors
//
// A failed registry call is either infrastructure — the registry could not
// be reached, or answered 5xx, 408 or 429 — and worth retrying later
// ([IsInfra]), or a refusal — any other 4xx: unauthorized, denied, unknown,
// invalid — that the same request will meet again ([IsRejected]). A
// registry that wants a login the keychain does not have answers 401
// UNAUTHORIZED, a refusal.
//
// # The embedded registry
//
// [New] is the CNCF distribution registry (github.com/distribution/distribution/v3)
// with its filesystem storage driver: blobs, manifests, tags and uploads
// are all kept on disk under one directory, so a registry started again on
// the same directory — `builds up` run again with the same --state — serves
// every image and build cache it was given. Deleting manifests and blobs is
// enabled; the referrers API is not (distribution does not implement it).
// It logs nothing unless given a logger ([WithLogger]) and keeps no global
// state: two registries run side by side in one process. At scale,
// meshbuild points at any other registry instead. [Serve] runs it on a TCP
// address:
//
//	srv, err := registry.Serve(ctx, "127.0.0.1:0", dir)
//	// srv.Addr() is "127.0.0.1:41234"; images are "127.0.0.1:41234/runtime".
//	defer srv.Close()
package registry
