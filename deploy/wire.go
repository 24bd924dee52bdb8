package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// WireVersion is the version of every payload this package puts on the wire.
const WireVersion = 1

// Enrol is a node's request to join the mesh, published on the
// mesh-controller seat's enrol verb. Reply is where the controller answers:
// a work-queue message keeps no reply subject, so the address travels in the
// payload, and it must be one of the node's own answer subjects.
type Enrol struct {
	Version   int      `json:"version"`
	Node      string   `json:"node"`
	Identity  string   `json:"identity"`
	Platforms []string `json:"platforms,omitempty"`
	Reply     string   `json:"reply"`
	// Applied is the revision the node has applied: a declaration is
	// numbered above it (a controller that lost its store starts again
	// from it, not from 1, which the node would refuse as stale).
	Applied uint64 `json:"applied,omitempty"`
}

// EnrolAnswer is the controller's answer to an enrolment.
type EnrolAnswer struct {
	Node string `json:"node"`
	OK   bool   `json:"ok"`
	// Created is false when the node was enrolled already (idempotent).
	Created bool   `json:"created,omitempty"`
	Error   string `json:"error,omitempty"`
	// Holder and Since name the machine that holds the name when an
	// enrolment is refused because another machine enrolled it.
	Holder string    `json:"holder,omitempty"`
	Since  time.Time `json:"since,omitzero"`
}

// Declaration is what one node should run: the controller composes it and
// publishes it as state (the last one per node); the node applies the newest
// and refuses one at or below the revision it applied.
type Declaration struct {
	Version  int              `json:"version"`
	Node     string           `json:"node"`
	Revision uint64           `json:"revision"`
	Modules  []DeclaredModule `json:"modules"`
	Composed time.Time        `json:"composed"`
}

// DeclaredModule is one module assigned to a node: its image by digest (empty
// while the module has never been built, or for a module that is not built
// into an image), the seats it holds and the buckets it is issued.
type DeclaredModule struct {
	Module string `json:"module"`
	Image  string `json:"image,omitempty"` // repository, without tag or digest
	Digest string `json:"digest,omitempty"`
	Seats  []Seat `json:"seats,omitempty"`
	// Buckets are the buckets the module is issued (ADR 0201), by the name
	// it uses for each: its own state read-write, its reads read-only. The
	// runtime serves the module these and refuses any other.
	Buckets []mesh.IssuedBucket `json:"buckets,omitempty"`
}

// Ref is the module's image reference by digest, "" when it has none.
func (m DeclaredModule) Ref() string {
	if m.Image == "" || m.Digest == "" {
		return ""
	}
	return m.Image + "@" + m.Digest
}

// Seat is a seat a module holds, with its scope.
type Seat struct {
	Seat  string `json:"seat"`
	Scope string `json:"scope"`
}

// Kinds of report a node sends to the mesh-controller seat.
const (
	Applied   = "applied"
	Failed    = "failed"
	Refused   = "refused"
	Heartbeat = "heartbeat"
)

// Report is what a node tells the controller: the outcome of a declaration
// (applied, failed, refused) or that it is alive (heartbeat).
type Report struct {
	Version int    `json:"version"`
	Kind    string `json:"kind"`
	Node    string `json:"node"`
	// Revision is the declaration the report is about; for a heartbeat,
	// the revision applied.
	Revision uint64 `json:"revision"`
	// Applied is the revision the node runs after this report.
	Applied uint64          `json:"applied"`
	Modules []AppliedModule `json:"modules,omitempty"`
	Reason  string          `json:"reason,omitempty"`
	Took    time.Duration   `json:"took,omitempty"`
	At      time.Time       `json:"at"`
}

// AppliedModule is a module as the node runs it.
type AppliedModule struct {
	Module string `json:"module"`
	Digest string `json:"digest,omitempty"`
	// Carried is true for a module the runtime runs in-process (build-agent).
	Carried bool `json:"carried,omitempty"`
}

// ErrMalformed is wrapped by the refusal of a payload that cannot be used.
var ErrMalformed = errors.New("malformed payload")

func decode[T any](data []byte, v *T) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

// Validate refuses an enrolment the controller cannot act on.
func (e Enrol) Validate() error {
	if err := mesh.ValidMachineName(mesh.KindNode, e.Node); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	switch {
	case e.Identity == "":
		return fmt.Errorf("%w: enrolment of %s has no machine identity", ErrMalformed, e.Node)
	case !underAnswer(e.Node, e.Reply):
		return fmt.Errorf("%w: enrolment of %s answers at %q: the reply address must be one of the node's own (%s)",
			ErrMalformed, e.Node, e.Reply, mesh.NodeAnswerAll(e.Node))
	}
	return nil
}

func underAnswer(node, reply string) bool {
	prefix := mesh.NodeAnswerSubject(node, "")
	return len(reply) > len(prefix) && reply[:len(prefix)] == prefix
}

// Validate refuses a report the controller cannot act on.
func (r Report) Validate() error {
	if err := mesh.ValidNodeName(r.Node); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	switch r.Kind {
	case Applied, Failed, Refused, Heartbeat:
		return nil
	}
	return fmt.Errorf("%w: report kind %q: want applied, failed, refused or heartbeat", ErrMalformed, r.Kind)
}
