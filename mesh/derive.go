package mesh

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Limits the mesh puts on what it derives.
const (
	// EventsMaxAge is how long EVENTS keeps an event.
	EventsMaxAge = 7 * 24 * time.Hour
	// LogsMaxBytes bounds LOGS; the oldest output goes first.
	LogsMaxBytes = 256 << 20
	// LogsMaxAge is how long LOGS keeps output.
	LogsMaxAge = 7 * 24 * time.Hour
	// BucketMaxValue and BucketMaxBytes are ADR 0201's caps.
	BucketMaxValue = 256 << 10
	BucketMaxBytes = 64 << 20
	// DuplicateWindow is how long a work queue remembers an ask id
	// (Nats-Msg-Id), so a re-submit inside it is a no-op.
	DuplicateWindow = time.Hour
	// HolderAckWait is how long a holder may stay silent on an ask before it
	// is redelivered; holders send InProgress every third of it. It is how
	// long a dead machine's ask waits before another takes it (its claim,
	// with a lease of three quarters of it, has lapsed by then): issue 20's
	// "a lost machine replaced in seconds". See README's table of leases.
	HolderAckWait = 8 * time.Second
	// ConsumerAckWait is the ack wait of a module's event consumer.
	ConsumerAckWait = 30 * time.Second
	// ClaimMarkerTTL is how long ClaimsBucket keeps the marker the server
	// leaves where a claim lapsed (its holder stopped renewing). The marker
	// is what tells a waiting claimant the seat is free.
	ClaimMarkerTTL = time.Hour
	// ClaimMaxLease is the longest lease a claim may carry, and the claims
	// bucket's max age: what a claim written without a TTL lives at most.
	ClaimMaxLease = 10 * time.Minute
	// ClaimMaxValue bounds one claim's record.
	ClaimMaxValue = 4 << 10
	// HolderMaxDeliver bounds how often a seat's ask is delivered: an ask
	// delivered this many times and never settled (a poison ask that kills
	// every holder that takes it) is given up by the server, which
	// announces it (MaxDeliveriesAdvisory, kept in GaveUpStream) and the
	// controller fails it.
	// Holders hand an ask back rarely (stopping, a sick machine, a claim
	// alive elsewhere) and retry infrastructure failures by time, with
	// delays of up to a minute, so a healthy ask never comes near it.
	HolderMaxDeliver = 50
)

// StreamSpec is a stream the catalogue implies.
type StreamSpec struct {
	Config jetstream.StreamConfig
	// Why says which declaration implies it.
	Why string
}

// ConsumerSpec is a durable consumer the catalogue implies.
type ConsumerSpec struct {
	Stream string
	Config jetstream.ConsumerConfig
	Why    string
}

// BucketSpec is a key-value bucket the catalogue implies.
type BucketSpec struct {
	Module string
	Config jetstream.KeyValueConfig
	Why    string
	// DiscardOld makes a full bucket drop its oldest entries to take a
	// new one, where a bucket refuses the write (nats.go makes every
	// bucket's stream DiscardNew): Raise sets it on the stream.
	DiscardOld bool
}

// Wire is everything a catalogue implies on the server.
type Wire struct {
	Streams   []StreamSpec
	Consumers []ConsumerSpec
	Buckets   []BucketSpec
}

// Derive returns every stream, consumer and bucket the catalogue implies,
// in a deterministic order. Replicas is the replica count of each (1 for a
// single server, 3 for a cluster).
func (c *Catalogue) Derive(replicas int) Wire {
	if replicas < 1 {
		replicas = 1
	}
	var w Wire
	w.Streams = append(w.Streams, c.eventStreams(replicas)...)
	w.Streams = append(w.Streams, NodesStreamSpec(replicas))
	for _, s := range c.Seats() {
		if spec, ok := SeatStreamSpec(s, c.Platforms(), replicas); ok {
			w.Streams = append(w.Streams, spec)
			w.Consumers = append(w.Consumers, SeatConsumerSpecs(s, c.Platforms(), replicas)...)
			w.Buckets = append(w.Buckets, AskClaimsBucketSpec(s, replicas))
			if slices.Contains(ControllerUses, s.Seat) {
				w.Streams = append(w.Streams, GaveUpStreamSpec(s, replicas))
				w.Consumers = append(w.Consumers, GaveUpConsumerSpec(s, replicas))
			}
		}
	}
	for _, m := range c.Modules {
		w.Consumers = append(w.Consumers, c.ModuleConsumerSpecs(m, replicas)...)
		for _, b := range m.State {
			w.Buckets = append(w.Buckets, BucketSpecOf(m.Module, b, replicas))
		}
	}
	w.Buckets = append(w.Buckets, ClaimsBucketSpec(replicas))
	return w
}

// ClaimsBucketSpec derives the mesh's bucket of seat claims. Every claim
// carries its own lease as a per-key TTL (LimitMarkerTTL turns those on), so
// a claim whose holder stops renewing lapses on the server's clock.
func ClaimsBucketSpec(replicas int) BucketSpec {
	return BucketSpec{
		Why: "one holder per seat and scope (design 29 §5)",
		Config: jetstream.KeyValueConfig{
			Bucket: ClaimsBucket(), History: 1, LimitMarkerTTL: ClaimMarkerTTL,
			// Nothing written here outlives its writer by more than the
			// longest lease: a write without a TTL (its own key, by a
			// holder's credentials) still goes.
			TTL:          ClaimMaxLease,
			MaxValueSize: ClaimMaxValue, MaxBytes: BucketMaxBytes,
			Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
		},
	}
}

// eventStreams derives EVENTS and LOGS: each carries exactly the declared
// event subjects, so the two never overlap.
func (c *Catalogue) eventStreams(replicas int) []StreamSpec {
	var events, logs []string
	add := func(event, subject string) {
		if IsLogEvent(event) {
			logs = append(logs, subject)
		} else {
			events = append(events, subject)
		}
	}
	for _, s := range c.Seats() {
		for _, e := range s.Emits {
			add(e, SeatEventSubjectOf(s, e))
		}
	}
	for _, m := range c.Modules {
		for _, e := range m.Emits {
			add(e, ModuleEventSubject(m.Module, e))
		}
	}
	sort.Strings(events)
	sort.Strings(logs)
	out := []StreamSpec{{
		Why: "every declared event",
		Config: jetstream.StreamConfig{
			Name: EventsStream, Subjects: events, Retention: jetstream.LimitsPolicy,
			MaxAge: EventsMaxAge, Storage: jetstream.FileStorage, Replicas: replicas,
			Duplicates: DuplicateWindow, Discard: jetstream.DiscardOld,
		},
	}}
	if len(logs) > 0 {
		out = append(out, StreamSpec{
			Why: "every declared log.* event, bounded by size",
			Config: jetstream.StreamConfig{
				Name: LogsStream, Subjects: logs, Retention: jetstream.LimitsPolicy,
				MaxAge: LogsMaxAge, MaxBytes: LogsMaxBytes, Storage: jetstream.FileStorage,
				Replicas: replicas, Discard: jetstream.DiscardOld,
			},
		})
	}
	return out
}

// SeatRetain is how long a seat's work queue keeps an ask: the longest
// retain of its verbs (one stream per seat).
func SeatRetain(s Seat) time.Duration {
	var max time.Duration
	for _, a := range s.Accepts {
		if acc, err := ParseAccept(a); err == nil && acc.Retain > max {
			max = acc.Retain
		}
	}
	if max == 0 {
		max = DefaultRetain
	}
	return max
}

// SeatStreamSpec derives seat s's work queue; ok is false for a seat that
// accepts nothing. Its subjects are exactly its holders' consumers'
// filters (SeatConsumerSpecs, for the catalogue's platforms): every
// accept, or, for a seat that splits by platform, each verb on each
// platform the catalogue builds for. An ask published anywhere else under
// the seat — the bare verb (…accept.build), a platform no module is built
// for — is refused by the server at once (no stream answers it) instead of
// being kept for the seat's retain with nobody to read it. Sorted, so that
// raising twice changes nothing; a raise after the catalogue's platforms
// changed updates them.
func SeatStreamSpec(s Seat, platforms []string, replicas int) (StreamSpec, bool) {
	if len(s.Accepts) == 0 {
		return StreamSpec{}, false
	}
	var subjects []string
	for _, c := range SeatConsumerSpecs(s, platforms, replicas) {
		if c.Config.FilterSubject != "" {
			subjects = append(subjects, c.Config.FilterSubject)
		}
		subjects = append(subjects, c.Config.FilterSubjects...)
	}
	sort.Strings(subjects)
	subjects = slices.Compact(subjects)
	return StreamSpec{
		Why: "seat " + s.Seat + " accepts work",
		Config: jetstream.StreamConfig{
			Name: SeatStream(s.Seat), Subjects: subjects,
			Retention: jetstream.WorkQueuePolicy, MaxAge: SeatRetain(s),
			Storage: jetstream.FileStorage, Replicas: replicas,
			// The server refuses a window longer than the max age.
			Duplicates: min(DuplicateWindow, SeatRetain(s)), Discard: jetstream.DiscardOld,
		},
	}, true
}

// GaveUpStreamSpec derives the stream that keeps the server's advisories of
// the asks it gave up on in seat s's queue (GaveUpStream), for a seat the
// controller submits to. It is a work queue: an advisory the controller has
// worked (the module failed, the ask taken out of the queue) is gone. One
// older than the seat's retain is about an ask the queue itself dropped.
func GaveUpStreamSpec(s Seat, replicas int) StreamSpec {
	return StreamSpec{
		Why: "the controller hears of every ask the server gave up on in " + SeatStream(s.Seat) + ", even one given up while no controller ran",
		Config: jetstream.StreamConfig{
			Name: GaveUpStream(s.Seat), Subjects: []string{MaxDeliveriesAdvisory(SeatStream(s.Seat), "*")},
			Retention: jetstream.WorkQueuePolicy, MaxAge: SeatRetain(s),
			Storage: jetstream.FileStorage, Replicas: replicas,
		},
	}
}

// GaveUpConsumerSpec derives the controller's durable consumer on seat s's
// GaveUpStream.
func GaveUpConsumerSpec(s Seat, replicas int) ConsumerSpec {
	return ConsumerSpec{
		Stream: GaveUpStream(s.Seat),
		Why:    "the holder of " + ControllerSeat + " works the asks the server gave up on in " + SeatStream(s.Seat),
		Config: jetstream.ConsumerConfig{
			Durable: GaveUpConsumer(), AckPolicy: jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy, Replicas: replicas,
		},
	}
}

// Fleet is the size of the fleet that holds one seat's consumer (one
// platform's, for a seat that splits by platform): its machines, each on its
// own connection, and the slots of each, each slot one pull waiting.
type Fleet struct {
	Machines, Slots int
}

// DefaultFleet is the fleet the holders' consumers are raised for: 10,000
// machines of one slot (issue #23). MaxWaiting is only a cap (the server
// keeps no room for pulls that do not wait), so a large one costs nothing
// while the fleet is small; and the server refuses to change it on an
// existing consumer, so it is raised once, big enough.
var DefaultFleet = Fleet{Machines: 10_000, Slots: 1}

// FleetSettings are the server settings a fleet needs (FleetSettingsOf).
type FleetSettings struct {
	// MaxWaiting is the holders' consumer's cap on pull requests waiting.
	MaxWaiting int
	// NoFile is the open files limit (RLIMIT_NOFILE: ulimit -n, a unit's
	// LimitNOFILE) the server needs: a descriptor per connection and its
	// own files.
	NoFile uint64
	// FetchWait is how long an idle slot's pull waits before it is
	// renewed (the agent's Config.FetchWait, build-agent --fetch-wait):
	// the server walks every waiting pull each time one of them expires
	// or is due a heartbeat, so the fleet's expiries and heartbeats are
	// held to about FleetPullEvents a second.
	FetchWait time.Duration
	// APIQueueLimit is the server's JetStream API queue limit (its
	// `jetstream { request_queue_limit: N }`, server.Options'
	// JetStreamRequestQueueLimit; the info queue's takes it): the
	// requests it holds before it answers them. A server whose queue
	// reaches it drops every request queued, unanswered; each asker times
	// out and asks again. Every machine of a fleet starting at once (a
	// restart, a new fleet) asks StartInfoRequests of the info queue, and
	// a consumer's info walks every pull waiting on it: at 10,000
	// machines on the default 10,000 the server dropped 10,000 requests
	// as the fleet started, and in a second run kept dropping its
	// machines' retries for more than 2 minutes (issue #23).
	APIQueueLimit int
	// Shards is how many shards the build seat's queue of each platform
	// wants (the seat's `shards`): one up to ShardAbove pulls waiting,
	// beyond it one per ShardPulls, so that no consumer walks more than
	// that many each time it runs dry (see ShardPulls).
	Shards int
}

// StartInfoRequests is how many requests of the JetStream API's info
// queue a build machine makes as it starts, at most: four streams' infos
// (the claims bucket, for its seat's claim and again for its ask claims;
// the build records' bucket; its seat's ask claims bucket) and a
// consumer's info for each platform its buildkitd builds — five on an
// x86-64 machine with AVX-512 (linux/amd64, its v2, v3 and v4,
// linux/386), four without it (no v4); a consumer the controller has not
// raised is asked again FetchWait later, not in the burst.
// cmd/internal/daemon TestAStartAsksTheInfoQueueAtMostStartInfoRequests
// counts them on a real server (nine on a v4 host, where 8 was exceeded).
// On a seat of shards a machine outside shard 0 asks its own shard's
// consumer too, one more a platform (14): APIQueueLimit's retry of each
// covers it.
const StartInfoRequests = 9

// ServerAPIQueueLimit is nats-server's default JetStream API queue limit
// (server.JSDefaultRequestQueueLimit): FleetSettingsOf's APIQueueLimit is
// never below it.
const ServerAPIQueueLimit = 10_000

// FleetPullEvents is how many pull expiries and heartbeats a second an
// idle fleet may cost its server (FleetSettingsOf's FetchWait): at 10,000
// machines renewing every 5 s, 2,000 a second each walked all 10,000
// waiting pulls (a look-up of each one's interest), and the consumer's
// goroutine did little else.
const FleetPullEvents = 200

// MinFetchWait is the FetchWait of a fleet small enough for pulls of 5
// s, the agent's default.
const MinFetchWait = 5 * time.Second

// Margins FleetSettingsOf adds to what a fleet needs.
const (
	// FleetOtherConnections are the connections beside the machines':
	// controllers, CLIs, tools and the routes of a cluster.
	FleetOtherConnections = 256
	// ServerFiles are the server's own descriptors: JetStream's message
	// block and index files of every stream and bucket, its listeners and
	// logs.
	ServerFiles = 1024
)

// FleetSettingsOf derives the server settings fleet f needs, on one server:
//
//   - MaxWaiting ≥ 1.25 × machines × slots: an idle slot keeps one pull
//     waiting and renews it, the quarter covers a renewal that arrives before
//     the pull it replaces expires (SCALE.md). Beyond the cap the server
//     answers a Fetch "409 Exceeded MaxWaiting" and drops a Consume's pull
//     without an error: the machine sits idle.
//
//   - NoFile ≥ machines + FleetOtherConnections + ServerFiles: with 1,024
//     and 1,100 machines the server accepted 1,010 connections and
//     JetStream could no longer open its files; the stream stopped
//     (SCALE.md).
//
//   - FetchWait = max(MinFetchWait, 2 × machines × slots ÷
//     FleetPullEvents seconds): a pull of 10 s or more is also heard from
//     half way (agent.PullHeartbeat), two events a pull, so the fleet's
//     come to FleetPullEvents a second. A pull lost to a
//     reconnect is noticed within the wait (the heartbeat's double): a
//     fleet that large always has another machine idle.
//
//   - APIQueueLimit = max(ServerAPIQueueLimit, 2 × machines ×
//     StartInfoRequests): every machine's start at once, and a retry of
//     each (an asker that times out asks again while the server still
//     holds its first request).
//
//   - Shards = 1 up to ShardAbove pulls, beyond it ⌈machines × slots ÷
//     ShardPulls⌉ (at most MaxShards; see ShardPulls for the measure).
//
// At DefaultFleet: MaxWaiting 12,500, NoFile 11,280, FetchWait 100 s,
// APIQueueLimit 180,000, Shards 40.
func FleetSettingsOf(f Fleet) FleetSettings {
	machines, slots := max(f.Machines, 1), max(f.Slots, 1)
	return FleetSettings{
		MaxWaiting: (5*machines*slots + 3) / 4,
		NoFile:     uint64(machines + FleetOtherConnections + ServerFiles),
		FetchWait:  max(MinFetchWait, time.Duration(2*machines*slots)*time.Second/FleetPullEvents),
		// Infos are asked per machine, not per slot.
		APIQueueLimit: max(ServerAPIQueueLimit, 2*machines*StartInfoRequests),
		Shards:        shardsFor(machines * slots),
	}
}

// shardsFor is FleetSettingsOf's Shards for a fleet of pulls pulls.
func shardsFor(pulls int) int {
	if pulls <= ShardAbove {
		return 1
	}
	return min(MaxShards, (pulls+ShardPulls-1)/ShardPulls)
}

// ConnectionsFor is how many client connections a server whose open files
// limit is nofile is given (its max_connections): what the limit leaves
// beside ServerFiles, or half of a limit too small for that. A server
// that runs out of descriptors stops JetStream's streams (SCALE.md); one
// that caps its connections refuses the connection beyond the cap with
// "maximum connections exceeded", which the machine that asked logs, and
// every stream goes on.
func ConnectionsFor(nofile uint64) int {
	if nofile > 2*ServerFiles {
		return int(min(nofile-ServerFiles, 1<<30))
	}
	return int(nofile / 2)
}

// MachinesFor is how many machines a server whose open files limit is
// nofile has room for: its ConnectionsFor less FleetOtherConnections (0
// when there is none).
func MachinesFor(nofile uint64) int {
	return max(ConnectionsFor(nofile)-FleetOtherConnections, 0)
}

// SeatConsumerSpec derives the one durable pull consumer every holder of
// seat s shares. A holder bounds its own retries by time and settles with
// Term; HolderMaxDeliver bounds an ask no holder ever settles.
func SeatConsumerSpec(s Seat, replicas int) ConsumerSpec {
	return ConsumerSpec{
		Stream: SeatStream(s.Seat),
		Why:    "the holders of " + s.Seat + " pull from it",
		Config: holderConsumer(SeatConsumer(s.Seat), replicas, SeatAcceptAll(s.Seat)),
	}
}

// SeatConsumerSpecs derives the holders' consumers of seat s: the one
// SeatConsumerSpec for a seat that does not split by platform; for one that
// does (SplitsByPlatform), one per platform and shard (ShardCount),
// filtering that platform's (and shard's) subject of every verb the seat
// accepts, so that a holder bound to the consumers of its platforms only
// ever receives asks it can build. A platform of several shards says how
// many in its consumers' metadata (ShardsMetadata).
func SeatConsumerSpecs(s Seat, platforms []string, replicas int) []ConsumerSpec {
	if !SplitsByPlatform(s.Seat) {
		return []ConsumerSpec{SeatConsumerSpec(s, replicas)}
	}
	var verbs []string
	for _, a := range s.Accepts {
		if acc, err := ParseAccept(a); err == nil {
			verbs = append(verbs, acc.Verb)
		}
	}
	sort.Strings(verbs)
	shards := s.ShardCount()
	out := make([]ConsumerSpec, 0, len(platforms)*shards)
	for _, p := range platforms {
		for k := range shards {
			filters := make([]string, len(verbs))
			for i, v := range verbs {
				filters[i] = SeatShardSubject(s.Seat, v, p, k)
			}
			why := "the holders of " + s.Seat + " that build " + p + " pull from it"
			if shards > 1 {
				why += fmt.Sprintf(" (shard %d of %d)", k, shards)
			}
			cfg := holderConsumer(SeatShardConsumer(s.Seat, p, k), replicas, filters...)
			if shards > 1 {
				// A machine binding shard 0 reads how many there are here.
				cfg.Metadata = map[string]string{ShardsMetadata: strconv.Itoa(shards)}
			}
			out = append(out, ConsumerSpec{Stream: SeatStream(s.Seat), Why: why, Config: cfg})
		}
	}
	return out
}

// HolderConsumers are the names of seat s's holders' consumers in the
// catalogue: one, or one per platform for a seat that splits by platform.
func (c *Catalogue) HolderConsumers(s Seat) []string {
	var out []string
	for _, spec := range SeatConsumerSpecs(s, c.Platforms(), 1) {
		out = append(out, spec.Config.Durable)
	}
	return out
}

// holderConsumer derives a holders' consumer on a seat's work queue. On a
// cluster (replicas > 1) its state is kept in memory (HolderStateInMemory).
func holderConsumer(name string, replicas int, filters ...string) jetstream.ConsumerConfig {
	cfg := jetstream.ConsumerConfig{
		Durable:   name,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: HolderAckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy, MaxDeliver: HolderMaxDeliver,
		MaxAckPending: 100_000, MaxWaiting: FleetSettingsOf(DefaultFleet).MaxWaiting, Replicas: replicas,
		MemoryStorage: HolderStateInMemory(replicas),
	}
	if len(filters) == 1 {
		cfg.FilterSubject = filters[0]
	} else {
		cfg.FilterSubjects = filters
	}
	return cfg

}

// HolderStateInMemory reports whether a holders' consumer of replicas
// keeps its state (what it delivered, to whom, what was acknowledged) in
// memory rather than on file: on a cluster, yes. Every delivery and every
// acknowledgement is a write of that state, replicated to each node; on
// file with the cluster's `sync: always` each is also an fsync on every
// node, in the path of every ask handed out (BenchmarkFleet1000 on three
// nodes, 1,000 machines: dispatch p99 10.4 ms on file, 7.5 ms in memory;
// makespan ÷ bound 1.071 and 1.053). In memory the state still lives on
// every node and outlives any of them; what a stop of the whole cluster
// at once loses is only which asks were delivered: the queue is a work
// queue, so an acknowledged ask is gone from the stream and is never
// delivered again, and one in a holder's hands at the stop is delivered
// again at once, to be left to its holder by the claims in the ask claims
// bucket (on file) — TestClusterPlanSurvivesAWholeClusterRestart. One
// server keeps it on file: its stop is the whole cluster's, and its
// fsyncs are not shared out among nodes.
func HolderStateInMemory(replicas int) bool { return replicas > 1 }

// ControllerEventsInMemory reports whether the consumer on EVENTS of the
// module that holds ControllerSeat keeps its state in memory: on a cluster,
// as the holders' consumers do (HolderStateInMemory), for the same fsyncs
// in the path of every outcome (BenchmarkFleet1000 on three nodes, 1,000
// machines: makespan ÷ bound 1.053 with it on file, 1.040 in memory). A
// stop of the whole cluster has it deliver EVENTS again from its start;
// the controller acknowledges, without working them, the events at or
// below the floor it stored (cascade's events floor). Another module's
// consumer keeps its state on file: nothing of the kind guards it.
func ControllerEventsInMemory(replicas int) bool { return replicas > 1 }

// AskClaimsBucketSpec derives the bucket seat s's holders claim asks in
// (AskClaimsBucket). A live claim carries its lease as the key's TTL, so it
// lapses on the server's clock; a settled one (its outcome, or the budget
// an ask spent on infrastructure) outlives its ask: the bucket keeps it for
// the seat's retain and the queue's duplicate window after, as long as it
// has room. Full, it drops its oldest claims (DiscardOld): a live claim is
// renewed every third of its lease, so the oldest are settled ones, long
// past their asks. Refusing instead, a fleet that settled some 60,000 asks
// inside the retain (a week by default) had every new claim refused, and
// every ask failed once delivered HolderMaxDeliver times.
func AskClaimsBucketSpec(s Seat, replicas int) BucketSpec {
	return BucketSpec{
		DiscardOld: true,
		Why:        "the holders of " + s.Seat + " claim the asks they work",
		Config: jetstream.KeyValueConfig{
			Bucket: AskClaimsBucket(s.Seat), History: 1, TTL: SeatRetain(s) + DuplicateWindow,
			LimitMarkerTTL: ClaimMarkerTTL,
			// A settled claim keeps the event it announced (a failed one
			// with its log's tail).
			MaxValueSize: 64 << 10, MaxBytes: BucketMaxBytes,
			Storage: jetstream.FileStorage, Replicas: replicas,
		},
	}
}

// ModuleConsumerSpecs derives module m's durable consumers: one on EVENTS
// carrying a filter for every event it consumes, and one on LOGS if it
// consumes log events.
func (c *Catalogue) ModuleConsumerSpecs(m *Manifest, replicas int) []ConsumerSpec {
	filters := map[string][]string{}
	for _, ref := range m.Consumes {
		subj, ok := c.ConsumedSubject(ref)
		if !ok {
			continue
		}
		_, event, _ := SplitRef(ref)
		st := EventStream(event)
		filters[st] = append(filters[st], subj)
	}
	var out []ConsumerSpec
	for _, st := range []string{EventsStream, LogsStream} {
		f := filters[st]
		if len(f) == 0 {
			continue
		}
		sort.Strings(f)
		out = append(out, ConsumerSpec{
			Stream: st,
			Why:    "module " + m.Module + " consumes " + joinComma(f),
			Config: jetstream.ConsumerConfig{
				Durable: ModuleConsumer(m.Module), FilterSubjects: f,
				AckPolicy: jetstream.AckExplicitPolicy, AckWait: ConsumerAckWait,
				DeliverPolicy: jetstream.DeliverAllPolicy, MaxDeliver: -1,
				MaxAckPending: 10_000, Replicas: replicas,
				MemoryStorage: st == EventsStream && slices.Contains(m.Holds, ControllerSeat) && ControllerEventsInMemory(replicas),
			},
		})
	}
	return out
}

// BucketSpecOf derives module m's bucket b.
func BucketSpecOf(module string, b Bucket, replicas int) BucketSpec {
	hist := b.History
	if hist < 1 {
		hist = 1
	}
	ttl, _ := ParseTTL(b.TTL)
	return BucketSpec{
		Module: module,
		Why:    "module " + module + " declares state " + b.Name,
		Config: jetstream.KeyValueConfig{
			Bucket: KVBucket(module, b.Name), History: uint8(hist), TTL: ttl,
			MaxValueSize: BucketMaxValue, MaxBytes: BucketMaxBytes,
			Storage: jetstream.FileStorage, Replicas: replicas,
		},
	}
}

func joinComma(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += ", "
		}
		out += s
	}
	return out
}
