// Package registry holds what meshbuild knows about OCI registries: the
// embedded registry of the default setup, resolving references to digests,
// telling a registry that is down from one that refuses, and the busybox
// base image that tests and the demo build on.
//
// # References and digests
//
// An image is named by a repository ("127.0.0.1:5000/runtime") and either a
// tag ("…/runtime:3f2a91c") or a digest ("…/runtime@sha256:…"). Tags move;
// digests do not. meshbuild pushes every image under a tag (the commit it was
// built from) but announces and consumes it only by digest: a dependent is
// always built on the base digest its ask names, whatever the tag points at
// by then. [Resolve] turns any reference into the digest of its manifest.
//
// Registries on loopback or private addresses are spoken to over plain HTTP
// (go-containerregistry's rule for such hosts); insecure=true extends that to
// any host.
//
// # Errors
//
// A failed registry call is either infrastructure — the registry could not
// be reached, or answered 5xx, 408 or 429 — and worth retrying later
// ([IsInfra]), or a refusal — any other 4xx: unauthorized, denied, unknown,
// invalid — that the same request will meet again ([IsRejected]).
//
// # The embedded registry
//
// [New] is an OCI distribution registry built on go-containerregistry's
// pkg/registry: blobs are stored on disk under a directory, one file per
// digest, but manifests and tags are kept in memory, as that library does.
// A restarted embedded registry therefore still holds every layer, but no
// image can be pulled from it until it is pushed again; build cache and
// images of an earlier run must be rebuilt (cheaply, since the layers are
// there). At scale, meshbuild points at a real registry instead. [Serve]
// runs it on a TCP address:
//
//	srv, err := registry.Serve(ctx, "127.0.0.1:0", dir)
//	// srv.Addr() is "127.0.0.1:41234"; images are "127.0.0.1:41234/runtime".
//	defer srv.Close()
package registry
