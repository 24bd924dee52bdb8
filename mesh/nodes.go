package mesh

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Nodes: the machines of the mesh (design 29 §5–§6, ADR 0121). A node enrols
// with the mesh-controller seat, and the controller keeps one declaration per
// node — what the node should run — as state: one stream, one subject per
// node, the last value only. Each node reads its own subject through a durable
// consumer named after it, because its ack grant is derived from that name.
const (
	// EnrolVerb and ReportVerb are what ControllerSeat accepts from nodes.
	EnrolVerb  = "enrol"
	ReportVerb = "report"
	// The controller's tools on its seat: the fleet's view and its
	// assignments.
	NodesTool    = "nodes"
	AssignTool   = "assign"
	UnassignTool = "unassign"
	SeatsTool    = "seats"

	// NodesStream keeps every node's declaration, the last one per node.
	NodesStream = "NODES"
	// NodeAckWait is how long a node may hold its declaration before it is
	// redelivered: applying is minutes on a machine pulling images.
	NodeAckWait = 5 * time.Minute

	tokNode        = "node"
	tokDeclaration = "declaration"
	tokAnswer      = "answer"
	maxNodeName    = 64
)

// ValidNodeName refuses a node name that cannot be a subject token and a
// durable consumer name: lowercase letters, digits and '-', like every local
// name (a dot would split the subject and is refused as a consumer name).
func ValidNodeName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("the node has no name: set --name NAME (lowercase letters, digits and '-')")
	case len(name) > maxNodeName:
		return fmt.Errorf("node name %q is longer than %d characters: choose a shorter one", name, maxNodeName)
	case !ValidName(name):
		return fmt.Errorf("node name %q cannot name its consumer and subject: use lowercase letters, digits and '-' (a host name's first label, such as %q)",
			name, suggestNodeName(name))
	}
	return nil
}

// MachineNameOf is the machine name a host name gives: its first label,
// lowercased, with what a name may not hold written '-' ("Build-1.example.com"
// is "build-1").
func MachineNameOf(host string) string { return suggestNodeName(host) }

func suggestNodeName(name string) string {
	out := []byte{}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			out = append(out, byte(r))
		case r >= 'A' && r <= 'Z':
			out = append(out, byte(r-'A'+'a'))
		case r == '.':
			if len(out) > 0 {
				return string(out)
			}
		default:
			if len(out) > 0 && out[len(out)-1] != '-' {
				out = append(out, '-')
			}
		}
	}
	if len(out) == 0 {
		return "build-1"
	}
	return string(out)
}

// NodeSubject is where node n's declaration is published: one subject per
// node, so the stream's last-value-per-subject keeps exactly the newest.
func NodeSubject(node string) string {
	return Root + "." + tokNode + "." + node + "." + tokDeclaration
}

// NodeSubjects is every node's declaration subject: the stream's subjects.
func NodeSubjects() string { return NodeSubject("*") }

// NodeConsumer is the name of node n's durable consumer on NodesStream. It is
// the node's name, because the node's ack grant is derived from it (ADR 0121:
// a consumer named anything else is one the node cannot acknowledge from).
func NodeConsumer(node string) string { return node }

// NodeAckSubject is node n's ack grant on its consumer.
func NodeAckSubject(node string) string { return AckSubject(NodesStream, NodeConsumer(node)) }

// NodeAnswerSubject is node n's address for the controller's answers (the
// reply address of an enrolment travels in the payload: a work-queue message
// keeps no reply subject). id makes one request's address its own.
func NodeAnswerSubject(node, id string) string {
	return Root + "." + tokNode + "." + node + "." + tokAnswer + "." + id
}

// NodeAnswerAll is every answer subject of node n ("*" for every node).
func NodeAnswerAll(node string) string { return NodeAnswerSubject(node, ">") }

// NodesStreamSpec derives the declarations stream: one message per node
// subject, the newest, so a node that was away reads exactly the current
// declaration and never a queue of superseded ones.
func NodesStreamSpec(replicas int) StreamSpec {
	return StreamSpec{
		Why: "every node's declaration, the last one per node",
		Config: jetstream.StreamConfig{
			Name: NodesStream, Subjects: []string{NodeSubjects()},
			Retention: jetstream.LimitsPolicy, MaxMsgsPerSubject: 1,
			Storage: jetstream.FileStorage, Replicas: max(1, replicas),
			Discard: jetstream.DiscardOld,
		},
	}
}

// NodeConsumerSpec derives node n's consumer: named after the node, filtered
// to its subject, no max-deliver (there is one message to redeliver for as
// long as the node is away) and a five-minute ack wait.
func NodeConsumerSpec(node string, replicas int) ConsumerSpec {
	return ConsumerSpec{
		Stream: NodesStream,
		Why:    "node " + node + " reads its declarations",
		Config: jetstream.ConsumerConfig{
			Durable: NodeConsumer(node), FilterSubject: NodeSubject(node),
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: NodeAckWait,
			DeliverPolicy: jetstream.DeliverAllPolicy, MaxDeliver: -1,
			MaxAckPending: 1, Replicas: max(1, replicas),
		},
	}
}

// NodePermissions derives node n's permission set: bind its own consumer,
// acknowledge from it and reset it, ask the controller's seat to enrol it and hear its
// reports, and read its own inbox and answers. Nothing else.
func NodePermissions(node string) Permissions {
	p := permSet{pub: map[string]bool{}, sub: map[string]bool{}}
	for _, g := range consumerGrants(NodesStream, NodeConsumer(node)) {
		p.pub[g] = true
	}
	// Its consumer is its own: a node started again takes back the
	// declaration its killed predecessor had in hand (seat.Consume).
	p.pub[ConsumerReset(NodesStream, NodeConsumer(node))] = true
	p.pub[SeatAcceptSubject(ControllerSeat, EnrolVerb)] = true
	p.pub[SeatAcceptSubject(ControllerSeat, ReportVerb)] = true
	p.sub[InboxPrefix(PrincipalID(KindNode, node))+".>"] = true
	p.sub[NodeAnswerAll(node)] = true
	return p.done(PrincipalID(KindNode, node), false)
}
