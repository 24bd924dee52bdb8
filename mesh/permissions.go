package mesh

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// Permissions is a principal's derived NATS permission set: what it may
// publish and subscribe to, and whether it may answer requests it receives.
// Nobody writes an access rule; the set comes from a declaration.
type Permissions struct {
	Principal string   `json:"principal"`
	Publish   []string `json:"publish"`
	Subscribe []string `json:"subscribe"`
	// Responses lets the principal reply to requests it received (serving
	// tools) without a publish grant on reply subjects.
	Responses bool `json:"responses,omitempty"`
}

// InboxPrefix is principal p's reply-subject prefix: request replies and
// pull deliveries come here, and no other principal may read them. A client
// sets it with nats.CustomInboxPrefix.
func InboxPrefix(principal string) string { return "_INBOX_" + principal }

// The JetStream API subjects a principal needs, each derived from the names
// it touches.
func consumerNext(stream, consumer string) string {
	return "$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer
}
func consumerInfo(stream, consumer string) string {
	return "$JS.API.CONSUMER.INFO." + stream + "." + consumer
}

// ConsumerReset is the subject that resets a consumer to its ack floor
// (seat.Consume's take-back): granted only where one holder has the
// consumer to itself — a grant on a consumer holders share would let one
// of them have every other's asks in hand delivered again.
func ConsumerReset(stream, consumer string) string {
	return "$JS.API.CONSUMER.RESET." + stream + "." + consumer
}

// StreamLeaderStepdown is the subject that asks a replicated stream's
// leader to hand over, to the server its request prefers (LeadHere).
func StreamLeaderStepdown(stream string) string {
	return "$JS.API.STREAM.LEADER.STEPDOWN." + stream
}

// ConsumerLeaderStepdown is the same for a consumer of a replicated stream.
func ConsumerLeaderStepdown(stream, consumer string) string {
	return "$JS.API.CONSUMER.LEADER.STEPDOWN." + stream + "." + consumer
}

// consumerGrants are what binding to a durable pull consumer takes: look it
// up, fetch from it, acknowledge what it delivered.
func consumerGrants(stream, consumer string) []string {
	return []string{consumerInfo(stream, consumer), consumerNext(stream, consumer), AckSubject(stream, consumer)}
}

// holderGrants are what holding seat s's queue takes: consumerGrants of
// each of its holders' consumers; beyond HolderGrantsEach of them (a seat
// of shards, a catalogue of many platforms), those of every consumer of
// its stream (whose only consumers are its holders'), as three subjects.
// A consumer's grants are some 340 bytes of the credentials' JWT, which
// the client sends in its CONNECT, and a server refuses a CONNECT longer
// than its max_control_line (4 KB by default: "maximum control line
// exceeded"): a catalogue of four platforms made a 3.9 KB JWT, and no
// agent could connect; three shards of two platforms, 4.6 KB. A machine of
// a seat of shards holds the other shards' consumers too, to take an ask
// left in one (agent stealFrom).
func holderGrants(c *Catalogue, s Seat) []string {
	stream := SeatStream(s.Seat)
	if s.ShardCount() > 1 || len(c.HolderConsumers(s)) > HolderGrantsEach {
		return consumerGrants(stream, "*")
	}
	var out []string
	for _, cons := range c.HolderConsumers(s) {
		out = append(out, consumerGrants(stream, cons)...)
	}
	return out
}

// HolderAckGrants are the ack subjects holding seat s's queue grants
// (holderGrants): one a consumer, or one for every consumer of its stream.
func (c *Catalogue) HolderAckGrants(s Seat) []string {
	var out []string
	for _, g := range holderGrants(c, s) {
		if strings.HasPrefix(g, "$JS.ACK.") {
			out = append(out, g)
		}
	}
	return out
}

// HolderGrantsEach is how many holders' consumers of a seat credentials
// grant one by one (holderGrants).
const HolderGrantsEach = 2

// bucketReadGrants are what reading and watching a bucket takes.
func bucketReadGrants(bucket string) []string {
	st := KVStream(bucket)
	return []string{
		"$JS.API.STREAM.INFO." + st,
		"$JS.API.STREAM.MSG.GET." + st,
		"$JS.API.DIRECT.GET." + st + ".>",
		"$JS.API.CONSUMER.CREATE." + st + ".>",
		"$JS.API.CONSUMER.DELETE." + st + ".>",
		"$JS.FC." + st + ".>",
	}
}

// keyReadGrants are what reading one key of a bucket takes (its stream's
// info, and a direct get of that key alone).
func keyReadGrants(bucket, key string) []string {
	st := KVStream(bucket)
	return []string{
		"$JS.API.STREAM.INFO." + st,
		"$JS.API.DIRECT.GET." + st + "." + KVKeySubject(bucket, key),
	}
}

// ControllerUses are the seats the mesh's controller submits work to. The
// controller files no manifest, so this is stated, not derived (ADR 0121).
var ControllerUses = []string{BuildSeat}

// ControllerJetStream is the controller's grant on the JetStream API: it is
// the only writer of stream, consumer and bucket definitions.
const ControllerJetStream = "$JS.API.>"

// ModulePermissions derives module m's permission set: its own namespace,
// the seats it holds, the seats it uses (publish on accepts only), its
// consumers and its buckets. A module's own credentials speak for no
// machine: the grants of a node-scoped seat it holds (its events, its
// claims, its ask claims) are a machine's (MachinePermissions).
func (c *Catalogue) ModulePermissions(m *Manifest) Permissions {
	return c.holderPermissions(m, "", PrincipalID(KindModule, m.Module))
}

// MachinePermissions derives the set of the build agent on machine: the
// build agent module's set, with every grant of the node-scoped seats it
// holds pinned to the machine — it publishes the seats' events only on the
// subjects that name it (HolderEventSubject), writes only its own seat
// claim (ClaimKey) and its own ask claims (MachineAskClaims), writes only
// its own build records, and reads only its own inbox
// (InboxPrefix(PrincipalID(KindAgent, machine))). No machine can speak for,
// lock out or read the deliveries of another (issue 19).
func (c *Catalogue) MachinePermissions(machine string) (Permissions, error) {
	if err := ValidMachineName(KindAgent, machine); err != nil {
		return Permissions{}, err
	}
	m, ok := c.Module(AgentModule)
	if !ok {
		return Permissions{}, fmt.Errorf("the catalogue has no module %s: a build machine's permissions are that module's, pinned to the machine", AgentModule)
	}
	return c.holderPermissions(m, machine, PrincipalID(KindAgent, machine)), nil
}

// holderPermissions is module m's set as principal, holding its node-scoped
// seats on machine (none when machine is empty).
func (c *Catalogue) holderPermissions(m *Manifest, machine, principal string) Permissions {
	p := permSet{pub: map[string]bool{}, sub: map[string]bool{}}
	p.sub[InboxPrefix(principal)+".>"] = true
	for _, e := range m.Emits {
		p.pub[ModuleEventSubject(m.Module, e)] = true
	}
	for _, t := range m.Serves {
		p.sub[ModuleToolSubject(m.Module, t)] = true
	}
	for _, s := range c.HeldSeats(m) {
		c.heldSeatPermissions(p, s, machine)
	}
	for _, s := range m.Uses {
		p.pub[SeatAcceptAll(s)] = true
	}
	for _, spec := range c.ModuleConsumerSpecs(m, 1) {
		for _, g := range consumerGrants(spec.Stream, spec.Config.Durable) {
			p.pub[g] = true
		}
	}
	statePermissions(p, m, machine)
	return p.done(principal, len(m.Serves) > 0 || servesAny(c.HeldSeats(m)))
}

// heldSeatPermissions adds to p what a holder of seat s may do on machine
// ("" for nobody in particular, who may not speak for any machine at a
// node-scoped seat).
func (c *Catalogue) heldSeatPermissions(p permSet, s Seat, machine string) {
	node := s.Scope == ScopeNode
	if node && machine == "" {
		// Nobody in particular: it may not speak for any machine.
	} else {
		for _, e := range s.Emits {
			if node {
				p.pub[HolderEventSubject(s.Seat, machine, e)] = true
			} else {
				p.pub[SeatEventSubject(s.Seat, e)] = true
			}
		}
		// A holder claims its seat before it pulls: it writes its own
		// claim and reads the bucket (who holds it, since when).
		if node {
			p.pub[KVKeySubject(ClaimsBucket(), ClaimKey(s.Seat, machine))] = true
		} else {
			p.pub[ClaimSubjects(s.Seat)] = true
		}
		for _, g := range bucketReadGrants(ClaimsBucket()) {
			p.pub[g] = true
		}
	}
	for _, t := range s.Serves {
		p.sub[SeatToolSubject(s.Seat, t)] = true
	}
	if node && machine != "" && slices.Contains(s.Serves, StatusTool) {
		// A sick machine asks its fellow holders' status (is a healthy
		// one online?) before it fails an ask "no healthy machine";
		// their other tools (cancel) stay the controller's.
		p.pub[SeatToolSubject(s.Seat, StatusTool)] = true
		// It answers on its own subject, and hears every holder's
		// answers there.
		p.pub[HolderStatusSubject(s.Seat, machine)] = true
		p.sub[HolderStatusSubject(s.Seat, AnyHolder)] = true
	}
	if len(s.Accepts) > 0 && (!node || machine != "") {
		for _, g := range holderGrants(c, s) {
			p.pub[g] = true
		}
		// Before it builds, a holder claims the ask in the bucket the
		// seat's holders share: under its own keys on a machine.
		if node {
			p.pub[MachineAskClaims(s.Seat, machine)] = true
			// It reads back an event the stream took as a duplicate
			// of its own, to tell its own earlier publish (or the
			// outcome it adopts) from another's that took the id.
			for _, g := range streamMsgGrants(EventsStream) {
				p.pub[g] = true
			}
		} else {
			p.pub[KVSubjects(AskClaimsBucket(s.Seat))] = true
		}
		for _, g := range bucketReadGrants(AskClaimsBucket(s.Seat)) {
			p.pub[g] = true
		}
	}
}

// statePermissions adds to p module m's own buckets (a machine writes its
// own build records only) and those it reads.
func statePermissions(p permSet, m *Manifest, machine string) {
	for _, b := range m.State {
		name := KVBucket(m.Module, b.Name)
		switch {
		case machine != "" && m.Module == AgentModule && b.Name == AgentBuildsBucket:
			// A machine writes its own records only.
			p.pub[KVKeySubject(name, BuildRecordKey("*", machine))] = true
		default:
			p.pub[KVSubjects(name)] = true
		}
		for _, g := range bucketReadGrants(name) {
			p.pub[g] = true
		}
	}
	for _, ref := range m.Reads {
		if owner, bucket, ok := SplitRef(ref); ok {
			for _, g := range bucketReadGrants(KVBucket(owner, bucket)) {
				p.pub[g] = true
			}
		}
	}
}

// ControllerPermissions derives the controller's set: that of every module
// holding mesh-controller, plus the mesh's own named list — the JetStream
// API (it raises the wire) and the accepts of ControllerUses.
func (c *Catalogue) ControllerPermissions(principal string) Permissions {
	p := permSet{pub: map[string]bool{}, sub: map[string]bool{}}
	responses := false
	for _, m := range c.Holders("mesh-controller") {
		mp := c.ModulePermissions(m)
		for _, s := range mp.Publish {
			p.pub[s] = true
		}
		for _, s := range mp.Subscribe {
			p.sub[s] = true
		}
		responses = responses || mp.Responses
		// The controller calls its own tools to learn it is serving them
		// (its readiness probe).
		p.pub[ModuleToolSubject(m.Module, "*")] = true
	}
	p.sub[InboxPrefix(principal)+".>"] = true
	p.pub[ControllerJetStream] = true
	for _, s := range ControllerUses {
		p.pub[SeatAcceptAll(s)] = true
		// The controller asks the holders of the seats it uses to cancel
		// work in flight and to say how they are (the seat's tools).
		p.pub[SeatToolSubject(s, "*")] = true
		// It works the asks the server gave up on in their queues, kept
		// in GaveUpStream (it pulls through the JetStream API and acks).
		p.pub[AckSubject(GaveUpStream(s), GaveUpConsumer())] = true
	}
	// The controller writes every node's declaration and answers a node's
	// enrolment at the address its payload names.
	p.pub[NodeSubjects()] = true
	p.pub[NodeAnswerAll("*")] = true
	return p.done(principal, responses)
}

// OperatorPermissions derives the set of an operator's `builds` CLI: it
// speaks for mesh-git (announcing pushes), calls the tools of the modules
// holding mesh-controller and of the seats the controller uses, reads their
// buckets and follows build output in LOGS. An operator files no manifest,
// so this is a named list, built with the same functions.
func (c *Catalogue) OperatorPermissions(principal string) Permissions {
	p := permSet{pub: map[string]bool{}, sub: map[string]bool{}}
	p.sub[InboxPrefix(principal)+".>"] = true
	p.pub[SeatEventSubject(GitSeat, EventPushed)] = true
	for _, m := range c.Holders("mesh-controller") {
		p.pub[ModuleToolSubject(m.Module, "*")] = true
		for _, b := range m.State {
			for _, g := range bucketReadGrants(KVBucket(m.Module, b.Name)) {
				p.pub[g] = true
			}
		}
	}
	for _, s := range ControllerUses {
		p.pub[SeatToolSubject(s, "*")] = true
		// The holders answer its status requests on their own subjects.
		p.sub[HolderStatusSubject(s, AnyHolder)] = true
	}
	// The mesh's own seats' tools: the fleet's view and its assignments.
	for _, s := range MeshSeats {
		if len(s.Serves) > 0 {
			p.pub[SeatToolSubject(s.Seat, "*")] = true
		}
	}
	for _, g := range streamReadGrants(LogsStream) {
		p.pub[g] = true
	}
	// Who holds the controller's seat, and since when: a push no
	// controller answers is queued behind a missing one, or waits for a
	// busy one (builds push). No other claim: the machines' are theirs.
	for _, g := range keyReadGrants(ClaimsBucket(), ClaimKey(ControllerSeat, "")) {
		p.pub[g] = true
	}
	c.operatorStateGrants(p)
	return p.done(principal, false)
}

// streamMsgGrants are what reading one message of a stream by its
// sequence takes.
func streamMsgGrants(stream string) []string {
	return []string{
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.API.DIRECT.GET." + stream,
	}
}

// streamReadGrants are what reading a stream through an ordered consumer
// takes.
func streamReadGrants(stream string) []string {
	return []string{
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.CONSUMER.CREATE." + stream + ".>",
		"$JS.API.CONSUMER.DELETE." + stream + ".>",
		"$JS.API.CONSUMER.INFO." + stream + ".>",
		"$JS.API.CONSUMER.MSG.NEXT." + stream + ".>",
	}
}

func servesAny(seats []Seat) bool {
	for _, s := range seats {
		if len(s.Serves) > 0 {
			return true
		}
	}
	return false
}

type permSet struct{ pub, sub map[string]bool }

func (p permSet) done(principal string, responses bool) Permissions {
	return Permissions{Principal: principal, Publish: keys(p.pub), Subscribe: keys(p.sub), Responses: responses}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ServerPermissions turns a derived set into the embedded server's form, for
// configuring a user (tests, the embedded default).
func (p Permissions) ServerPermissions() *server.Permissions {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: AllowList(p.Publish)},
		Subscribe: &server.SubjectPermission{Allow: AllowList(p.Subscribe)},
	}
	if p.Responses {
		sp.Response = &server.ResponsePermission{MaxMsgs: 1}
	}
	return sp
}
