package mesh

import (
	"strings"
)

// The wire grammar. Every name on the wire is derived by exactly one function
// in this file; everything that needs a name — the stream, the consumer, the
// permission, the subscriber, the publisher — calls it, so they cannot drift
// apart (ADR 0121, issue 127).
const (
	// Root is the first token of every subject the mesh derives.
	Root = "mesh"

	// EventsStream keeps every declared event except logs.
	EventsStream = "EVENTS"
	// LogsStream keeps log.* events, bounded by size.
	LogsStream = "LOGS"

	tokMod    = "mod"
	tokSeat   = "seat"
	tokEvent  = "event"
	tokTool   = "tool"
	tokAccept = "accept"
	tokOn     = "on"

	seatStreamPrefix   = "SEAT_"
	gaveUpStreamPrefix = "GAVEUP_"
	logEventPrefix     = "log"
)

// ReservedTokens are the derivation's own tokens; a verb, event or tool may
// not be named one of them where the name would be read as a token.
var ReservedTokens = []string{tokMod, tokSeat, tokEvent, tokTool, tokAccept, Root}

// WireName turns a local name (dotted, with the mesh's wildcards * and **)
// into subject tokens: * stays *, ** becomes >.
func WireName(local string) string {
	parts := strings.Split(local, ".")
	for i, p := range parts {
		if p == "**" {
			parts[i] = ">"
		}
	}
	return strings.Join(parts, ".")
}

// ModuleEventSubject is where module m publishes its event e.
func ModuleEventSubject(module, event string) string {
	return Root + "." + tokMod + "." + module + "." + tokEvent + "." + WireName(event)
}

// ModuleToolSubject is the request/reply subject of module m's tool t.
func ModuleToolSubject(module, tool string) string {
	return Root + "." + tokMod + "." + module + "." + tokTool + "." + WireName(tool)
}

// SeatAcceptSubject is where work asking seat s to do verb v is published.
func SeatAcceptSubject(seat, verb string) string {
	return Root + "." + tokSeat + "." + seat + "." + tokAccept + "." + WireName(verb)
}

// SeatAcceptAll is every subject of seat s's work queue.
func SeatAcceptAll(seat string) string {
	return SeatAcceptSubject(seat, "**")
}

// SeatEventSubject is where a holder of seat s publishes the seat's event e.
func SeatEventSubject(seat, event string) string {
	return Root + "." + tokSeat + "." + seat + "." + tokEvent + "." + WireName(event)
}

// HolderEventSubject is where the holder on machine of a node-scoped seat s
// publishes the seat's event e: "mesh.seat.<s>.on.<machine>.event.<e>". The
// machine is a token of the subject, so the permission a machine's
// credentials carry pins it (MachinePermissions): an outcome names who said
// it, and no machine can speak for another (issue 19). "*" as machine is
// every holder's: what a subscriber, a stream or a consumer filters on.
func HolderEventSubject(seat, machine, event string) string {
	return Root + "." + tokSeat + "." + seat + "." + tokOn + "." + machine + "." + tokEvent + "." + WireName(event)
}

// AnyHolder is the machine token of HolderEventSubject that matches every
// holder.
const AnyHolder = "*"

// HolderStatusSubject is where the holder on machine of node-scoped seat s
// answers the seat's status tool: "mesh.seat.<s>.on.<machine>.status". A
// request on the tool's subject is answered here, not on the requester's
// inbox: the machine token is pinned by the machine's credentials, so an
// answer names who gave it, and no machine can answer for another.
// AnyHolder as machine is every holder's, what a requester subscribes to.
func HolderStatusSubject(seat, machine string) string {
	return Root + "." + tokSeat + "." + seat + "." + tokOn + "." + machine + "." + WireName(StatusTool)
}

// HolderOfStatusSubject is the machine a HolderStatusSubject names; ok is
// false for any other subject.
func HolderOfStatusSubject(seat, subject string) (machine string, ok bool) {
	t := strings.Split(subject, ".")
	if len(t) != 6 || t[0] != Root || t[1] != tokSeat || t[2] != seat || t[3] != tokOn || t[5] != WireName(StatusTool) {
		return "", false
	}
	return t[4], true
}

// SeatEventSubjectOf is where seat s's event e is published by whoever holds
// it: every holder's HolderEventSubject for a node-scoped seat (machines
// speak for themselves), SeatEventSubject for a mesh-scoped one (one holder).
// Streams, consumers and subscribers filter on it.
func SeatEventSubjectOf(s Seat, event string) string {
	if s.Scope == ScopeNode {
		return HolderEventSubject(s.Seat, AnyHolder, event)
	}
	return SeatEventSubject(s.Seat, event)
}

// SplitHolderEventSubject is the inverse of HolderEventSubject: the seat,
// the machine and the event (in its wire spelling) a subject names; ok is
// false for any other subject.
func SplitHolderEventSubject(subject string) (seat, machine, event string, ok bool) {
	t := strings.SplitN(subject, ".", 7)
	if len(t) != 7 || t[0] != Root || t[1] != tokSeat || t[3] != tokOn || t[5] != tokEvent {
		return "", "", "", false
	}
	return t[2], t[4], t[6], true
}

// SeatToolSubject is the request/reply subject of seat s's tool t.
func SeatToolSubject(seat, tool string) string {
	return Root + "." + tokSeat + "." + seat + "." + tokTool + "." + WireName(tool)
}

// IsLogEvent reports whether an event name is a log event (kept in LOGS, not
// EVENTS): "log" or anything under "log.".
func IsLogEvent(event string) bool {
	return event == logEventPrefix || strings.HasPrefix(event, logEventPrefix+".")
}

// LogEvent is the local name of the log event for one ask or job id.
func LogEvent(id string) string { return logEventPrefix + "." + id }

// EventStream is the stream that keeps an event: LOGS for log events,
// EVENTS otherwise.
func EventStream(event string) string {
	if IsLogEvent(event) {
		return LogsStream
	}
	return EventsStream
}

// SeatStream is the name of seat s's work-queue stream.
func SeatStream(seat string) string { return seatStreamPrefix + seat }

// SeatFromStream is the inverse of SeatStream; ok is false for a stream that
// is not a seat's work queue.
func SeatFromStream(stream string) (seat string, ok bool) {
	return strings.CutPrefix(stream, seatStreamPrefix)
}

// SeatConsumer is the name of the one durable pull consumer every holder of
// seat s shares. Seat names have no dots, and a durable name may not contain
// one (the fault ADR 0121 found), so the seat's name is used as is.
func SeatConsumer(seat string) string { return "holders-" + seat }

// ModuleConsumer is the name of module m's one durable consumer on EVENTS,
// carrying a filter for every event it consumes.
func ModuleConsumer(module string) string { return "module-" + module }

// AckSubject is the ack grant of a consumer on a stream: every ack, nak,
// in-progress and term for a message it delivered is published under it.
func AckSubject(stream, consumer string) string {
	return "$JS.ACK." + stream + "." + consumer + ".>"
}

// KVBucket is the name of module m's bucket b. Local names never contain
// "_", so two (module, bucket) pairs cannot derive the same name.
func KVBucket(module, bucket string) string { return module + "_" + bucket }

// KVStream is the stream behind a key-value bucket.
func KVStream(bucket string) string { return "KV_" + bucket }

// KVSubjects is every key subject of a bucket.
func KVSubjects(bucket string) string { return "$KV." + bucket + ".>" }

// ClaimsBucket is the mesh's own bucket of seat claims: one key per seat and
// scope, held by the one holder there (design 29 §5). Its name is upper
// case, so no module's bucket (KVBucket: lower case) can ever derive it.
func ClaimsBucket() string { return "CLAIMS" }

// ClaimKey is the key of seat s's claim at a scope: "<seat>.mesh" for a
// mesh-scoped seat (node empty), "<seat>.node.<node>" for a node-scoped one.
// Every key of a seat is under ClaimSubjects(seat).
func ClaimKey(seat, node string) string {
	if node == "" {
		return seat + "." + ScopeMesh
	}
	return seat + "." + ScopeNode + "." + node
}

// ClaimSubjects is every key subject of seat s's claims: what a holder of
// the seat may write in ClaimsBucket.
func ClaimSubjects(seat string) string { return KVKeySubject(ClaimsBucket(), ClaimKeys(seat)) }

// ClaimKeys is the key filter matching every claim of seat, at any scope.
func ClaimKeys(seat string) string { return seat + ".>" }

// KVKeySubject is the subject a bucket's key is written on.
func KVKeySubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// AskClaimsBucket is the bucket the holders of seat s share to claim the
// asks they work: one key per ask (AskClaimKey), created if absent before a
// holder builds, renewed while it works, and marked done once its outcome
// is announced. Its name is upper case, so no module's bucket (KVBucket:
// lower case) can ever derive it.
func AskClaimsBucket(seat string) string { return "ASKS_" + seat }

// AskClaimKey is the key of machine's claim of ask id in its seat's
// AskClaimsBucket: "<ask>.<machine>". Each machine writes only its own keys
// (the permission pins the last token), so a claim names its holder and no
// machine can write, renew or delete another's. Ask ids and machine names
// have no dots.
func AskClaimKey(ask, machine string) string { return ask + "." + machine }

// AskClaimKeys is the key filter of every machine's claim of ask id.
func AskClaimKeys(ask string) string { return AskClaimKey(ask, "*") }

// MachineAskClaims is every key subject machine may write in seat s's
// AskClaimsBucket: its own claims of any ask.
func MachineAskClaims(seat, machine string) string {
	return KVKeySubject(AskClaimsBucket(seat), AskClaimKey("*", machine))
}

// MaxDeliveriesAdvisory is the subject the server announces on when it gives
// up on a message of a stream's consumer: it was delivered the consumer's
// MaxDeliver times and never settled.
func MaxDeliveriesAdvisory(stream, consumer string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + "." + consumer
}

// GaveUpStream is the stream that keeps the server's max-deliveries
// advisories for seat s's queue (MaxDeliveriesAdvisory of SeatStream(s), any
// consumer) until the controller has worked them: an advisory is a plain
// message, and one sent while no controller listens would otherwise be lost,
// leaving the given-up ask's module queued until its retain passes.
func GaveUpStream(seat string) string { return gaveUpStreamPrefix + seat }

// GaveUpConsumer is the name of the one durable consumer on every
// GaveUpStream: the holders of mesh-controller pull from it.
func GaveUpConsumer() string { return SeatConsumer(ControllerSeat) }
