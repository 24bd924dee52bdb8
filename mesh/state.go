package mesh

import (
	"context"
	"slices"
	"sort"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Module state (ADR 0201): a module owns the buckets it declares under
// state (by local name) and reads the ones it names under reads
// ("<module>.<bucket>"). Each assignment is issued its buckets: by the name
// the module uses for each, the bucket on the wire, and whether it may write.
// The runtime serves them from that list; the node's permission set is the
// union over the modules it carries (NodeStatePermissions).

// IssuedBucket is one bucket a module is issued with its assignment.
type IssuedBucket struct {
	// Name is the module's own name for it: a state name ("plans") for a
	// bucket it owns, the reads entry ("other.bindings") for one it reads.
	Name string `json:"name"`
	// Bucket is the key-value bucket on the wire (KVBucket).
	Bucket string `json:"bucket"`
	// Write is true for the module's own state, false for what it reads.
	Write bool `json:"write,omitempty"`
}

// IssuedBuckets derives the buckets module m is issued: its own state
// read-write, its reads read-only, sorted by name. A read whose reference
// does not parse is left out (the catalogue check refuses it).
func (c *Catalogue) IssuedBuckets(m *Manifest) []IssuedBucket {
	var out []IssuedBucket
	for _, b := range m.State {
		out = append(out, IssuedBucket{Name: b.Name, Bucket: KVBucket(m.Module, b.Name), Write: true})
	}
	for _, ref := range m.Reads {
		if owner, bucket, ok := SplitRef(ref); ok {
			out = append(out, IssuedBucket{Name: ref, Bucket: KVBucket(owner, bucket)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// OperatorBuckets derives the buckets an operator's `builds state` reaches:
// every declared bucket of the catalogue, named "<module>.<bucket>",
// read-write — but the controller's own (the plans, the input keys, the
// nodes' declarations) and the build agents' records read-only: those are
// the farm's word on what it built, and an operator changes them through
// the controller's tools (retry, rebuild, cancel, assign), which check what
// they are asked (issue 19).
func (c *Catalogue) OperatorBuckets() []IssuedBucket {
	farm := map[string]bool{AgentModule: true}
	for _, m := range c.Holders(ControllerSeat) {
		farm[m.Module] = true
	}
	var out []IssuedBucket
	for _, m := range c.Modules {
		for _, b := range m.State {
			out = append(out, IssuedBucket{Name: m.Module + "." + b.Name, Bucket: KVBucket(m.Module, b.Name), Write: !farm[m.Module]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// bucketGrants adds to p what using an issued bucket takes: reading and
// watching it, and writing it when issued so.
func bucketGrants(p permSet, b IssuedBucket) {
	if b.Write {
		p.pub[KVSubjects(b.Bucket)] = true
	}
	for _, g := range bucketReadGrants(b.Bucket) {
		p.pub[g] = true
	}
}

// NodeStatePermissions derives node n's permission set when it carries
// modules: NodePermissions(n), plus every bucket those modules are issued —
// write where any of them owns it, read where any reads it. The server
// enforces only this union; the runtime keeps each module to its own list.
// A module not in the catalogue adds nothing.
func (c *Catalogue) NodeStatePermissions(node string, modules []string) Permissions {
	base := NodePermissions(node)
	p := permSet{pub: map[string]bool{}, sub: map[string]bool{}}
	for _, s := range base.Publish {
		p.pub[s] = true
	}
	for _, s := range base.Subscribe {
		p.sub[s] = true
	}
	for _, name := range modules {
		if m, ok := c.Module(name); ok {
			for _, b := range c.IssuedBuckets(m) {
				if b.Write && name == AgentModule && b.Name == AgentBuildsBucket {
					// The machine's own records only.
					p.pub[KVKeySubject(b.Bucket, BuildRecordKey("*", node))] = true
					b.Write = false
				}
				bucketGrants(p, b)
			}
		}
	}
	return p.done(PrincipalID(KindNode, node), base.Responses)
}

// operatorStateGrants are the operator's grants on module state: read and
// write every declared bucket (`builds state`), and list the mesh's streams
// and consumers, read-only, to report what outlived its declaration
// (`builds catalogue show --live`).
func (c *Catalogue) operatorStateGrants(p permSet) {
	for _, b := range c.OperatorBuckets() {
		bucketGrants(p, b)
	}
	for _, g := range inspectGrants() {
		p.pub[g] = true
	}
}

// inspectGrants are what listing the server's streams and their consumers
// takes (Orphans).
func inspectGrants() []string {
	return []string{"$JS.API.STREAM.NAMES", "$JS.API.STREAM.INFO.*", "$JS.API.CONSUMER.NAMES.*"}
}

// Orphans lists the mesh's streams, buckets and consumers on the server that
// catalogue c no longer implies, without changing anything: what Raise
// reports, for a reader that does not raise (an operator).
func Orphans(ctx context.Context, js jetstream.JetStream, c *Catalogue) ([]string, error) {
	return findOrphans(ctx, js, c.Derive(1))
}

// OrphanBuckets keeps the buckets of an orphans list, by bucket name.
func OrphanBuckets(orphans []string) []string {
	var out []string
	for _, o := range orphans {
		if b, ok := strings.CutPrefix(o, "bucket "); ok {
			out = append(out, b)
		}
	}
	return slices.Clip(out)
}
