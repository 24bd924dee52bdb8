package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/backoff"
)

// RaiseReport says what a raise did to each name.
type RaiseReport struct {
	Created   []string `json:"created"`
	Updated   []string `json:"updated"`
	Unchanged []string `json:"unchanged"`
	// Orphans are streams, consumers and buckets the mesh made whose
	// declaration is gone. They are reported, never deleted: data outlives
	// the declaration that made it.
	Orphans []string `json:"orphans"`
	// Short are holders' consumers raised before with a MaxWaiting below
	// what DefaultFleet needs (FleetSettingsOf). The server refuses to
	// change it in place, so the raise keeps theirs; a holder that would
	// overflow it refuses to start (agent), and deleting the consumer
	// while no holder works lets the next raise make it anew.
	Short []string `json:"short,omitempty"`
	// KeptStorage are consumers (stream/name) that keep their state where
	// they were made (on file, or in memory) though the wire now says the
	// other: the server refuses the change in place, and one made anew
	// would deliver its stream again from the start. The build seat's
	// holders' consumers are made anew instead (their queue is a work
	// queue).
	KeptStorage []string `json:"kept_storage,omitempty"`
}

// Changed reports whether the raise changed anything on the server.
func (r RaiseReport) Changed() bool { return len(r.Created)+len(r.Updated) > 0 }

// Unanswered reports whether err is the bus not answering in time (a
// timeout, no responders, no stream response) or a cluster not able to
// place a stream yet (a peer still offline as the cluster starts, or
// JetStream's meta layer without a leader), not a refusal: an assertion
// that met it is worth making again, and every process that raises or
// asserts retries it (with backoff, said in the log) instead of stopping.
func Unanswered(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.ErrorCode == jsClusterNoPeers || api.ErrorCode == jsClusterNotAvailable)
}

// Answered calls fn again, with backoff and saying so in log, while what it
// returns is the bus not answering in time (Unanswered): a process that
// starts while the bus is away, or while a cluster started again elects its
// leaders, waits for it instead of stopping. Any other error is returned at
// once; fn's last error when ctx ends.
func Answered(ctx context.Context, log *slog.Logger, what string, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || ctx.Err() != nil || !Unanswered(err) {
			return err
		}
		if log != nil {
			log.Warn(what+": the bus did not answer; retrying", "err", err, "attempt", attempt)
		}
		if backoff.Wait(ctx, answeredRetry.Delay(attempt)) != nil {
			return err
		}
	}
}

// answeredRetry is how Answered waits between tries.
var answeredRetry = backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second}

// JetStream's error codes (nats-server's JSClusterNoPeersErrF and
// JSClusterNotAvailErr) for a cluster that cannot place or answer yet.
const (
	jsClusterNoPeers      jetstream.ErrorCode = 10005 // "no suitable peers for placement"
	jsClusterNotAvailable jetstream.ErrorCode = 10008 // "JetStream system temporarily unavailable"
)

// JetStream's error codes (nats-server's JSInsufficientResourcesErr and
// JSStorageResourcesExceededErr) for a stream or bucket refused for want of
// storage: the server's file storage (max_file_store) or the account's has
// less room left than the MaxBytes it would reserve.
const (
	jsInsufficientResources jetstream.ErrorCode = 10023
	jsStorageExceeded       jetstream.ErrorCode = 10047
)

// Reserved is the file storage the wire's streams and buckets reserve on
// each server that keeps a replica of them (the MaxBytes of those that
// have one), and what it is made of ("LOGS 256 MiB, 6 buckets of 64 MiB").
func (w Wire) Reserved() (int64, string) {
	var total int64
	var parts []string
	buckets := map[int64]int{}
	for _, s := range w.Streams {
		if s.Config.MaxBytes > 0 {
			total += s.Config.MaxBytes
			parts = append(parts, fmt.Sprintf("%s %d MiB", s.Config.Name, s.Config.MaxBytes>>20))
		}
	}
	for _, b := range w.Buckets {
		if b.Config.MaxBytes > 0 {
			total += b.Config.MaxBytes
			buckets[b.Config.MaxBytes]++
		}
	}
	sizes := make([]int64, 0, len(buckets))
	for n := range buckets {
		sizes = append(sizes, n)
	}
	sort.Slice(sizes, func(i, j int) bool { return sizes[i] > sizes[j] })
	for _, n := range sizes {
		if buckets[n] == 1 {
			parts = append(parts, fmt.Sprintf("1 bucket of %d MiB", n>>20))
		} else {
			parts = append(parts, fmt.Sprintf("%d buckets of %d MiB", buckets[n], n>>20))
		}
	}
	return total, strings.Join(parts, ", ")
}

// storageRefused says, of a stream or bucket the server refused for want
// of storage, what the wire reserves and what to do; any other error is
// returned as it is. By hand, `builds up` on a small disk said only
// "insufficient storage resources available" and stopped.
func (w Wire) storageRefused(err error) error {
	var api *jetstream.APIError
	if !errors.As(err, &api) || (api.ErrorCode != jsInsufficientResources && api.ErrorCode != jsStorageExceeded) {
		return err
	}
	total, parts := w.Reserved()
	return fmt.Errorf("%w: the server has less JetStream file storage left than the streams and buckets of the catalogue reserve, %d MiB in all (%s): "+
		"free disk where the server keeps its store, or raise its max_file_store (by default three quarters of the disk free when it starts); "+
		"builds up keeps the store in its --state directory", err, total>>20, parts)
}

// Raise asserts on the server every stream, consumer and bucket the catalogue
// implies, idempotently: asserting twice changes nothing. Streams come first,
// so a seat's work queue exists before any holder binds to it.
func Raise(ctx context.Context, js jetstream.JetStream, c *Catalogue, replicas int) (RaiseReport, error) {
	w := c.Derive(replicas)
	var r RaiseReport
	for _, s := range w.Streams {
		before, existed, err := streamConfig(ctx, js, s.Config.Name)
		if err != nil {
			return r, err
		}
		st, err := js.CreateOrUpdateStream(ctx, s.Config)
		if err != nil {
			return r, fmt.Errorf("asserting stream %s (%s): %w", s.Config.Name, s.Why, w.storageRefused(err))
		}
		r.note("stream", s.Config.Name, before, st.CachedInfo().Config, existed)
	}
	for _, b := range w.Buckets {
		stream := KVStream(b.Config.Bucket)
		before, existed, err := streamConfig(ctx, js, stream)
		if err != nil {
			return r, err
		}
		if _, err := js.CreateOrUpdateKeyValue(ctx, b.Config); err != nil {
			return r, fmt.Errorf("asserting bucket %s (%s): %w", b.Config.Bucket, b.Why, w.storageRefused(err))
		}
		if b.DiscardOld {
			if err := discardOld(ctx, js, stream); err != nil {
				return r, fmt.Errorf("asserting bucket %s (%s): %w", b.Config.Bucket, b.Why, err)
			}
		}
		after, _, err := streamConfig(ctx, js, stream)
		if err != nil {
			return r, err
		}
		r.note("bucket", b.Config.Bucket, before, after, existed)
	}
	for _, s := range w.Streams {
		if seat, ok := SeatFromStream(s.Config.Name); ok && SplitsByPlatform(seat) {
			replaced, err := dropSeatWide(ctx, js, seat)
			if err != nil {
				return r, err
			}
			if replaced {
				r.Updated = append(r.Updated, "consumer "+s.Config.Name+"/"+SeatConsumer(seat)+" (split by platform)")
			}
		}
	}
	for _, cs := range w.Consumers {
		if err := r.consumer(ctx, js, cs); err != nil {
			return r, err
		}
	}
	orphans, err := findOrphans(ctx, js, w)
	if err != nil {
		return r, err
	}
	r.Orphans = orphans
	return r, nil
}

// note files what asserting kind name did: created, updated or unchanged.
func (r *RaiseReport) note(kind, name string, before, after any, existed bool) {
	label := kind + " " + name
	switch {
	case !existed:
		r.Created = append(r.Created, label)
	case !reflect.DeepEqual(before, after):
		r.Updated = append(r.Updated, label)
	default:
		r.Unchanged = append(r.Unchanged, label)
	}
}

// consumer asserts one consumer and notes what that did.
func (r *RaiseReport) consumer(ctx context.Context, js jetstream.JetStream, cs ConsumerSpec) error {
	var before jetstream.ConsumerConfig
	existed := false
	if cons, err := js.Consumer(ctx, cs.Stream, cs.Config.Durable); err == nil {
		before, existed = cons.CachedInfo().Config, true
		if want := cs.Config.MaxWaiting; want > 0 && before.MaxWaiting > 0 && before.MaxWaiting < want {
			// The server answers "max waiting can not be updated".
			cs.Config.MaxWaiting = before.MaxWaiting
			r.Short = append(r.Short, fmt.Sprintf("consumer %s/%s: MaxWaiting %d, below the %d %d machines of %d slots need",
				cs.Stream, cs.Config.Durable, before.MaxWaiting, want, DefaultFleet.Machines, DefaultFleet.Slots))
		}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("looking up consumer %s on %s: %w", cs.Config.Durable, cs.Stream, err)
	}
	if existed && before.MemoryStorage != cs.Config.MemoryStorage {
		// The server answers "storage type can not be updated".
		replaced, err := replaceHolders(ctx, js, cs, before.MemoryStorage)
		if err != nil {
			return err
		}
		if !replaced {
			cs.Config.MemoryStorage = before.MemoryStorage
			r.KeptStorage = append(r.KeptStorage, cs.Stream+"/"+cs.Config.Durable)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cs.Stream, cs.Config)
	if err != nil {
		return fmt.Errorf("asserting consumer %s on %s (%s): %w", cs.Config.Durable, cs.Stream, cs.Why, err)
	}
	r.note("consumer", cs.Stream+"/"+cs.Config.Durable, before, cons.CachedInfo().Config, existed)
	return nil
}

// replaceHolders deletes a holders' consumer whose state is kept where cs
// no longer keeps it (in memory on a cluster, on file on one server:
// HolderStateInMemory), so that the raise makes it anew. Only a consumer on
// a seat's work queue: what it delivered is in the stream until
// acknowledged, so the new one delivers again what the old one had
// delivered and not seen acknowledged (its holders' claims refuse what
// another holder works), and its holders bind it again on their next pull.
// Any other consumer keeps where it was (replaced false): made anew, it
// would deliver its stream again from the start.
func replaceHolders(ctx context.Context, js jetstream.JetStream, cs ConsumerSpec, inMemory bool) (replaced bool, err error) {
	if _, ok := SeatFromStream(cs.Stream); !ok {
		return false, nil
	}
	err = js.DeleteConsumer(ctx, cs.Stream, cs.Config.Durable)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		where := map[bool]string{true: "memory", false: "file"}
		return false, fmt.Errorf("replacing consumer %s/%s, its state kept in %s, by one that keeps it in %s: %w",
			cs.Stream, cs.Config.Durable, where[inMemory], where[!inMemory], err)
	}
	return true, nil
}

// dropSeatWide deletes the one seat-wide holders' consumer a seat that now
// splits by platform had: on a work queue, its filter (every accept) would
// overlap each platform's and the server would refuse them. A consumer keeps
// no data (the asks stay in the stream), so this deletes nothing declared.
func dropSeatWide(ctx context.Context, js jetstream.JetStream, seat string) (bool, error) {
	stream, name := SeatStream(seat), SeatConsumer(seat)
	err := js.DeleteConsumer(ctx, stream, name)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("replacing consumer %s/%s by one per platform: %w", stream, name, err)
	}
}

func streamConfig(ctx context.Context, js jetstream.JetStream, name string) (jetstream.StreamConfig, bool, error) {
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return jetstream.StreamConfig{}, false, nil
	}
	if err != nil {
		return jetstream.StreamConfig{}, false, fmt.Errorf("looking up stream %s: %w", name, err)
	}
	return st.CachedInfo().Config, true, nil
}

// findOrphans lists the mesh's streams, buckets and consumers on the server
// that the catalogue no longer implies.
func findOrphans(ctx context.Context, js jetstream.JetStream, w Wire) ([]string, error) {
	want := map[string]bool{}
	for _, s := range w.Streams {
		want[s.Config.Name] = true
	}
	for _, b := range w.Buckets {
		want[KVStream(b.Config.Bucket)] = true
	}
	wantConsumer := map[string]bool{}
	for _, c := range w.Consumers {
		wantConsumer[c.Stream+"/"+c.Config.Durable] = true
	}
	var out []string
	names := js.StreamNames(ctx)
	var ours []string
	for name := range names.Name() {
		if isMeshStream(name) {
			ours = append(ours, name)
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("listing streams: %w", err)
	}
	sort.Strings(ours)
	for _, name := range ours {
		if !want[name] {
			if b, ok := strings.CutPrefix(name, "KV_"); ok {
				out = append(out, "bucket "+b)
			} else {
				out = append(out, "stream "+name)
			}
			continue
		}
		if strings.HasPrefix(name, "KV_") {
			continue
		}
		st, err := js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("looking up stream %s: %w", name, err)
		}
		cn := st.ConsumerNames(ctx)
		for c := range cn.Name() {
			if isMeshConsumer(c) && !wantConsumer[name+"/"+c] {
				out = append(out, "consumer "+name+"/"+c)
			}
		}
		if err := cn.Err(); err != nil {
			return nil, fmt.Errorf("listing consumers of %s: %w", name, err)
		}
	}
	return out, nil
}

// isMeshStream reports whether a stream is one the mesh derives.
func isMeshStream(name string) bool {
	if name == EventsStream || name == LogsStream {
		return true
	}
	if _, ok := SeatFromStream(name); ok {
		return true
	}
	if strings.HasPrefix(name, gaveUpStreamPrefix) {
		return true
	}
	if name == KVStream(ClaimsBucket()) {
		return true
	}
	if b, ok := strings.CutPrefix(name, "KV_"); ok {
		mod, bucket, ok := strings.Cut(b, "_")
		return ok && ValidName(mod) && ValidName(bucket)
	}
	return false
}

func isMeshConsumer(name string) bool {
	return strings.HasPrefix(name, SeatConsumer("")) || strings.HasPrefix(name, ModuleConsumer(""))
}

// MarshalIndent is a helper for printing a derived value as JSON.
func MarshalIndent(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// discardOld makes stream, a bucket's, drop its oldest entries when full
// (BucketSpec.DiscardOld).
func discardOld(ctx context.Context, js jetstream.JetStream, stream string) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	if cfg.Discard == jetstream.DiscardOld {
		return nil
	}
	cfg.Discard = jetstream.DiscardOld
	_, err = js.UpdateStream(ctx, cfg)
	return err
}

// WireGone reports whether the bus has lost what a controller raised: the
// claims bucket or EVENTS is not there any more (a server started again on
// an empty store, or the streams deleted by hand). A server that does not
// answer is not taken for one that lost them.
func WireGone(ctx context.Context, js jetstream.JetStream) bool {
	for _, name := range []string{KVStream(ClaimsBucket()), EventsStream} {
		if _, err := js.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
			return true
		}
	}
	return false
}

// RaiseClaims asserts the claims bucket alone, idempotently. A controller
// claims its seat before it raises the rest of the catalogue (only the
// holder raises), so the bucket it claims in comes first.
func RaiseClaims(ctx context.Context, js jetstream.JetStream, replicas int) error {
	spec := ClaimsBucketSpec(replicas)
	if _, err := js.CreateOrUpdateKeyValue(ctx, spec.Config); err != nil {
		return fmt.Errorf("asserting bucket %s (%s): %w", spec.Config.Bucket, spec.Why, Wire{Buckets: []BucketSpec{spec}}.storageRefused(err))
	}
	return nil
}
