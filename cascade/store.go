package cascade

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/kvsnap"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/seat"
	"github.com/meshbuild/meshbuild/state"
)

// Plan state lives in the controller's declared bucket (state: plans), one
// key per plan and one per module of a plan, so that a plan of any size fits
// the mesh's 256 KiB per value:
//
//	plan.<plan>            PlanRecord: trigger, sequence, outcome, counts
//	mod.<plan>.<module>    ModuleStatus
//	current.<module>       Current: the module's current image (newer plan wins)
//	estimate.<module>      the module's last build duration (asks are ranked by it),
//	                       when current.<module> does not carry it (its duration)
//	key.<input key>        KeyRecord: the digest an input key was built to, and the plan
//
// The plan's modules are not stored: a plan is a pure function of the
// catalogue and its trigger, and is planned again on resume.
const (
	// StateBucket is the controller module's bucket plans live in.
	StateBucket = "plans"

	keyPlan     = "plan."
	keyModule   = "mod."
	keyCurrent  = "current."
	keyEstimate = "estimate."
	keyInput    = "key."
	keySecret   = "secret.asks"
	keyFetching = "fetching."
	keyFloor    = "events.floor"
)

// EventsFloor is how far the controller's consumer on EVENTS had every
// event acknowledged: the stream's ack floor, and the stream it was read
// of (its creation time), as the controller stored it last.
type EventsFloor struct {
	Stream  time.Time `json:"stream"`
	Through uint64    `json:"through"`
}

// Floor reads the events floor last stored; ok is false if none was.
func (s *Store) Floor(ctx context.Context) (f EventsFloor, ok bool, err error) {
	e, err := s.kv.Get(ctx, keyFloor)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return f, false, nil
	}
	if err != nil {
		return f, false, fmt.Errorf("reading %s: %w", keyFloor, err)
	}
	if err := json.Unmarshal(e.Value(), &f); err != nil {
		return f, false, fmt.Errorf("decoding %s: %w", keyFloor, err)
	}
	return f, true, nil
}

// PutFloor stores the events floor (Put: not once the seat is lost).
func (s *Store) PutFloor(ctx context.Context, f EventsFloor) error {
	return s.Put(ctx, map[string]any{keyFloor: f})
}

// AskKey is the key the controller derives every ask's secret from
// (mesh.Ask.Secret): made once, at random, and kept in the bucket
// (secret.asks), so that a restarted or standby controller derives the
// same secrets for the asks it publishes again and checks the proofs of
// the asks in flight. Build machines cannot read the bucket.
func (s *Store) AskKey(ctx context.Context) ([]byte, error) {
	for range 3 {
		e, err := s.kv.Get(ctx, keySecret)
		if err == nil {
			k, derr := hex.DecodeString(string(e.Value()))
			if derr != nil || len(k) < 16 {
				return nil, fmt.Errorf("%s in the plans bucket is not a key (delete it to make a new one; the asks in flight are then refused and retried): %v", keySecret, derr)
			}
			return k, nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("reading %s: %w", keySecret, err)
		}
		k := make([]byte, 32)
		_, _ = rand.Read(k)
		if _, err := s.kv.Create(ctx, keySecret, []byte(hex.EncodeToString(k))); err == nil {
			return k, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("writing %s: %w", keySecret, err)
		}
		// Another controller made it first: read it.
	}
	return nil, fmt.Errorf("%s kept changing while it was read", keySecret)
}

// InputKeyKey is the key an input key's KeyRecord is kept under.
func InputKeyKey(key string) string { return keyInput + key }

// Keys returns every input key's record, by input key.
func (s *Store) Keys(ctx context.Context) (map[string]KeyRecord, error) {
	out := map[string]KeyRecord{}
	err := s.each(ctx, keyInput+"*", func(key string, data []byte) error {
		var r KeyRecord
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("decoding %s: %w", key, err)
		}
		out[strings.TrimPrefix(key, keyInput)] = r
		return nil
	})
	return out, err
}

// EstimateKey is the key of a module's last build duration: what asks are
// ranked by, kept so that a restarted controller still knows it.
func EstimateKey(module string) string { return keyEstimate + module }

// Estimates returns every module's last build duration.
func (s *Store) Estimates(ctx context.Context) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	err := s.each(ctx, keyEstimate+"*", func(key string, data []byte) error {
		var d time.Duration
		if err := json.Unmarshal(data, &d); err != nil {
			return fmt.Errorf("decoding %s: %w", key, err)
		}
		out[strings.TrimPrefix(key, keyEstimate)] = d
		return nil
	})
	return out, err
}

// PlanKey, ModuleKey and CurrentKey derive a plan's, a module's and a
// current image's keys.
func PlanKey(plan string) string             { return keyPlan + plan }
func ModuleKey(plan, module string) string   { return keyModule + plan + "." + module }
func ModulesOf(plan string) string           { return keyModule + plan + ".>" }
func CurrentKey(module string) string        { return keyCurrent + module }
func planOfKey(key string) (string, bool)    { return strings.CutPrefix(key, keyPlan) }
func moduleOfKey(plan, key string) string    { return strings.TrimPrefix(key, keyModule+plan+".") }
func currentOfKey(key string) (string, bool) { return strings.CutPrefix(key, keyCurrent) }

// OutcomeEmpty is the outcome of a plan whose trigger selected nothing.
const OutcomeEmpty Outcome = "empty"

// PlanRecord is a plan's summary: what `builds plans` lists.
type PlanRecord struct {
	ID      string          `json:"id"`
	Seq     uint64          `json:"seq"`
	Trigger planner.Trigger `json:"trigger"`
	Summary string          `json:"summary"`
	Outcome Outcome         `json:"outcome"`
	Message string          `json:"message,omitempty"`
	// Priority orders the plan against the others running, higher first
	// (State.Priority); Owner is whom its machine-time counts to (fair
	// share); Cap the most machines it may hold at once (0: none).
	Priority int    `json:"priority"`
	Owner    string `json:"owner,omitempty"`
	Cap      int    `json:"cap,omitempty"`
	// Held says what the plan's modules ready to build wait behind, when
	// the scheduler gave another plan the machines ("3 machines busy with
	// plan p-… (priority 10)", "capped at 4 machines").
	Held string `json:"held,omitempty"`
	// Superseding is when modules in flight were cancelled for a newer
	// plan (State.Superseding).
	Superseding time.Time `json:"superseding,omitzero"`
	Counts      Counts    `json:"counts"`
	Tiers       int       `json:"tiers"`
	// External are the digests of the bases outside the plan, resolved
	// when it was made (State.External).
	External map[string]string `json:"external,omitempty"`
	Created  time.Time         `json:"created"`
	Updated  time.Time         `json:"updated"`
	Finished time.Time         `json:"finished,omitzero"`
	// Forecast is a running plan's remaining critical path and estimated
	// finish when the record was written (CriticalPath); `builds show` and
	// `builds watch` compute it again as time passes.
	Forecast *Forecast `json:"forecast,omitempty"`
}

// Record summarises a state.
func Record(s *State) PlanRecord {
	r := PlanRecord{ID: s.Plan, Seq: s.Seq, Trigger: s.Trigger, Summary: s.Summary, Outcome: s.Outcome(),
		Counts: s.Counts(), Created: s.Created, Updated: s.Updated, External: s.External,
		Priority: s.Priority, Owner: s.Owner, Cap: s.Cap, Superseding: s.Superseding}
	s.ensure()
	r.Tiers = s.ix.tiers
	if r.Outcome != OutcomeRunning {
		r.Finished = s.Updated
	}
	return r
}

// Store reads and writes plan state in the bucket.
type Store struct {
	kv   jetstream.KeyValue
	snap *kvsnap.Bucket
	// Parallel bounds concurrent writes (OpenStore: storeParallel).
	Parallel int
	// Held, if set, is asked before each write and removal: none is made
	// once it says the writer no longer holds its seat
	// (Controller.SetHeld).
	Held claim.Holding
}

// OpenStore binds the controller module's plans bucket.
func OpenStore(ctx context.Context, js jetstream.JetStream, controllerModule string) (*Store, error) {
	kv, err := seat.OpenBucket(ctx, js, controllerModule, StateBucket)
	if err != nil {
		return nil, err
	}
	return &Store{kv: kv, snap: kvsnap.New(js, kv), Parallel: storeParallel}, nil
}

// storeParallel is how many writes a Store makes at once. At 64, a flush of
// a tier ending on a thousand machines (hundreds of modules, their current
// images, the modules they released) took 0.5 s a second on three servers
// with sync always, and the controller's events waited up to 0.6 s behind
// it; at 256, 0.3-0.45 s and 0.4 s.
const storeParallel = 256

// KV is the bucket.
func (s *Store) KV() jetstream.KeyValue { return s.kv }

// CreatePlan writes a plan's record only if it does not exist yet: a
// duplicate trigger, inside or outside JetStream's duplicate window, makes
// no second plan. created is false for a duplicate.
func (s *Store) CreatePlan(ctx context.Context, r PlanRecord) (created bool, err error) {
	data, err := json.Marshal(r)
	if err != nil {
		return false, err
	}
	if err := state.CheckSize(data); err != nil {
		return false, fmt.Errorf("creating plan %s: %w", r.ID, err)
	}
	if err := s.Held.Err(); err != nil {
		return false, fmt.Errorf("creating plan %s: %w", r.ID, err)
	}
	if _, err := s.kv.Create(ctx, PlanKey(r.ID), data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return false, nil
		}
		return false, fmt.Errorf("creating plan %s: %w", r.ID, err)
	}
	return true, nil
}

// PutError is Put's error: the keys it could not write, each with why.
type PutError struct {
	Failed map[string]error
}

func (e *PutError) Error() string {
	keys := make([]string, 0, len(e.Failed))
	for k := range e.Failed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	msg := fmt.Sprintf("writing %d keys failed", len(keys))
	for i, k := range keys {
		if i == 3 {
			msg += ", …"
			break
		}
		msg += fmt.Sprintf("; %s: %v", k, e.Failed[k])
	}
	return msg
}

// Unwrap is every key's error, so that errors.Is matches any of them.
func (e *PutError) Unwrap() []error {
	out := make([]error, 0, len(e.Failed))
	for _, err := range e.Failed {
		out = append(out, err)
	}
	return out
}

// Put writes values by key, in parallel. It writes every value it can; an
// error is a *PutError naming the keys it could not.
func (s *Store) Put(ctx context.Context, values map[string]any) error {
	var mu sync.Mutex
	failed := map[string]error{}
	var g errgroup.Group
	g.SetLimit(max(1, s.Parallel))
	for k, v := range values {
		g.Go(func() error {
			err := s.Held.Err()
			var data []byte
			if err == nil {
				data, err = json.Marshal(v)
			}
			if err == nil {
				// The limits every module's state keeps (package state).
				err = state.CheckSize(data)
			}
			if err == nil {
				_, err = s.kv.Put(ctx, k, data)
			}
			if err != nil {
				mu.Lock()
				failed[k] = err
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	if len(failed) > 0 {
		return &PutError{Failed: failed}
	}
	return nil
}

// PlanOfKey is the plan a key of the store belongs to, if any.
func PlanOfKey(key string) (string, bool) {
	if p, ok := planOfKey(key); ok {
		return p, true
	}
	rest, ok := strings.CutPrefix(key, keyModule)
	if !ok {
		return "", false
	}
	// mod.<plan>.<module>: plan ids have no dots.
	p, _, ok := strings.Cut(rest, ".")
	return p, ok
}

// Plans returns every plan record, newest first.
func (s *Store) Plans(ctx context.Context) ([]PlanRecord, error) {
	var out []PlanRecord
	err := s.each(ctx, keyPlan+"*", func(key string, data []byte) error {
		var r PlanRecord
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("decoding %s: %w", key, err)
		}
		out = append(out, r)
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Seq > out[j].Seq })
	return out, err
}

// ErrNoPlan is returned for a plan the store does not know.
var ErrNoPlan = errors.New("no such plan")

// Plan returns one plan's record.
func (s *Store) Plan(ctx context.Context, id string) (PlanRecord, error) {
	e, err := s.kv.Get(ctx, PlanKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return PlanRecord{}, fmt.Errorf("%w %s", ErrNoPlan, id)
	}
	if err != nil {
		return PlanRecord{}, fmt.Errorf("reading plan %s: %w", id, err)
	}
	var r PlanRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return PlanRecord{}, fmt.Errorf("decoding plan %s: %w", id, err)
	}
	return r, nil
}

// FetchingKey is the key of a push set aside while its commit is fetched
// (prefetch.go), by the plan it is to make.
func FetchingKey(plan string) string { return keyFetching + plan }

// Fetching is a push set aside while the controller fetches its commit:
// its plan is made when the commit is there.
type Fetching struct {
	Repo string `json:"repo"`
	// Commit is the push's commit, or empty for the HEAD of another
	// repository the plan's modules are built from.
	Commit string    `json:"commit"`
	Since  time.Time `json:"since"`
}

// MarkFetching records that plan's push waits for its commit's fetch.
func (s *Store) MarkFetching(ctx context.Context, plan string, f Fetching) error {
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if err := s.Held.Err(); err != nil {
		return err
	}
	_, err = s.kv.Put(ctx, FetchingKey(plan), data)
	return err
}

// Fetched removes plan's Fetching record.
func (s *Store) Fetched(ctx context.Context, plan string) error {
	if err := s.Held.Err(); err != nil {
		return err
	}
	err := s.kv.Delete(ctx, FetchingKey(plan))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}

// FetchingFor reads plan's Fetching record: ok when its push waits for a
// fetch.
func (s *Store) FetchingFor(ctx context.Context, plan string) (f Fetching, ok bool, err error) {
	e, err := s.kv.Get(ctx, FetchingKey(plan))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Fetching{}, false, nil
	}
	if err != nil {
		return Fetching{}, false, err
	}
	if err := json.Unmarshal(e.Value(), &f); err != nil {
		return Fetching{}, false, fmt.Errorf("decoding %s: %w", FetchingKey(plan), err)
	}
	return f, true, nil
}

// Modules returns a plan's module statuses, by module.
func (s *Store) Modules(ctx context.Context, plan string) (map[string]ModuleStatus, error) {
	out := map[string]ModuleStatus{}
	err := s.each(ctx, ModulesOf(plan), func(key string, data []byte) error {
		var m ModuleStatus
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("decoding %s: %w", key, err)
		}
		out[moduleOfKey(plan, key)] = m
		return nil
	})
	return out, err
}

// EachModule calls fn with every module of every plan in the store, in one
// read: what the controller recorded of each (its state, its machine).
func (s *Store) EachModule(ctx context.Context, fn func(plan, module string, m ModuleStatus)) error {
	return s.each(ctx, keyModule+">", func(key string, data []byte) error {
		var m ModuleStatus
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("decoding %s: %w", key, err)
		}
		rest := strings.TrimPrefix(key, keyModule)
		i := strings.LastIndex(rest, ".") // a module's name holds no dot
		if i < 0 {
			return nil
		}
		fn(rest[:i], rest[i+1:], m)
		return nil
	})
}

// Currents returns every module's current image.
func (s *Store) Currents(ctx context.Context) (map[string]Current, error) {
	out := map[string]Current{}
	err := s.each(ctx, keyCurrent+"*", func(key string, data []byte) error {
		var c Current
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("decoding %s: %w", key, err)
		}
		m, _ := currentOfKey(key)
		out[m] = c
		return nil
	})
	return out, err
}

// each calls fn with the current value of every key matching filter, in
// key order: every key that has a value, also while the bucket is written
// (kvsnap). A record fn cannot decode does not stop the others: each
// returns an *UnreadableError naming it once every key was read.
func (s *Store) each(ctx context.Context, filter string, fn func(key string, data []byte) error) error {
	vals, err := s.snap.Values(ctx, filter)
	if err != nil {
		return fmt.Errorf("reading %s: %w", filter, err)
	}
	var bad *UnreadableError
	for _, k := range slices.Sorted(maps.Keys(vals)) {
		if err := fn(k, vals[k].Value()); err != nil {
			if bad == nil {
				bad = &UnreadableError{Bucket: s.kv.Bucket(), Err: err}
			}
			bad.Keys = append(bad.Keys, k)
		}
	}
	if bad != nil {
		return bad
	}
	return nil
}

// UnreadableError names stored records that do not decode (written by
// hand, or by a version that wrote them otherwise). A read that returns it
// returns every other record too: the unreadable ones are left as they
// are, for an operator to look at, and nothing else stops for them. A
// module's record is written again with its next change; a plan whose own
// record cannot be read is not resumed.
type UnreadableError struct {
	Bucket string
	Keys   []string
	// Err is the first key's.
	Err error
}

func (e *UnreadableError) Error() string {
	return fmt.Sprintf("%d record(s) of bucket %s cannot be read and are left as they are: %s (%v); "+
		"look at one with `nats kv get %s KEY`, remove it with `nats kv del %s KEY`",
		len(e.Keys), e.Bucket, strings.Join(e.Keys, ", "), e.Err, e.Bucket, e.Bucket)
}

// Readable is err unless it is an *UnreadableError, which it gives to
// report and drops: what was read is used, the rest left.
func Readable(err error, report func(*UnreadableError)) error {
	var ue *UnreadableError
	if errors.As(err, &ue) {
		if report != nil {
			report(ue)
		}
		return nil
	}
	return err
}

// Load rebuilds a plan's state from its record, its modules in the store
// and the plan (planned again from the record's trigger).
func Load(p planner.Plan, r PlanRecord, mods map[string]ModuleStatus) (*State, error) {
	st := NewState(p, r.Created)
	st.Seq, st.Updated, st.External = r.Seq, r.Updated, r.External
	st.Priority, st.Owner, st.Cap, st.Superseding = r.Priority, r.Owner, r.Cap, r.Superseding
	if r.Outcome == OutcomeCancelled {
		st.Cancelled = r.Updated
	}
	for i := range st.Modules {
		if m, ok := mods[st.Modules[i].Module]; ok {
			st.Modules[i] = m
		}
	}
	// Round-trip through JSON: State rebuilds its index on decoding.
	data, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	out := &State{}
	if err := json.Unmarshal(data, out); err != nil {
		return nil, err
	}
	return out, nil
}

// Prune removes the oldest settled plans beyond the newest keep, with their
// module entries, so that the bucket (64 MiB at most) never fills: a full
// bucket would refuse every write of a running plan. It also removes the
// oldest settled plans, but the newest, while the bucket holds more than
// half its limit (pruneRoom): a few plans of a big catalogue fill it long
// before keep of them do (10,000 modules built are some 10 MB). Running
// plans are never removed. It returns how many plans it removed;
// PruneKeys, called after it, removes the input keys that went with them.
func (s *Store) Prune(ctx context.Context, keep int) (int, error) {
	recs, err := s.Plans(ctx) // newest first; an unreadable record is left
	if err := Readable(err, nil); err != nil {
		return 0, err
	}
	var settled []PlanRecord
	for _, r := range recs {
		if r.Outcome != OutcomeRunning {
			settled = append(settled, r)
		}
	}
	over, err := s.overRoom(ctx)
	if err != nil {
		return 0, err
	}
	removed := 0
	for i := len(settled) - 1; i >= 1; i-- { // oldest first, never the newest
		if i < keep && over <= 0 {
			break
		}
		freed, err := s.removePlan(ctx, settled[i].ID)
		if err != nil {
			return removed, err
		}
		over -= freed
		removed++
	}
	return removed, nil
}

// pruneRoom is the share of the bucket's limit Prune keeps it under.
const pruneRoom = 0.5

// overRoom is how many bytes the bucket holds beyond pruneRoom of its
// limit (none without one).
func (s *Store) overRoom(ctx context.Context) (int64, error) {
	st, err := s.kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the plans bucket's size: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return 0, nil // no stream to read the size of: pruned by count alone
	}
	info := bs.StreamInfo()
	if info.Config.MaxBytes <= 0 {
		return 0, nil
	}
	return int64(info.State.Bytes) - int64(pruneRoom*float64(info.Config.MaxBytes)), nil
}

// removePlan purges a plan's record and module entries, and returns about
// how many bytes they held.
func (s *Store) removePlan(ctx context.Context, id string) (int64, error) {
	var keys []string
	var size int64
	if err := s.each(ctx, ModulesOf(id), func(key string, data []byte) error {
		keys = append(keys, key)
		size += int64(len(key) + len(data))
		return nil
	}); err != nil {
		return 0, err
	}
	// The modules in parallel, as Put writes (a plan of 10,000 purged one
	// by one held the controller's loop for seconds), then the record.
	var g errgroup.Group
	g.SetLimit(max(1, s.Parallel))
	for _, k := range keys {
		g.Go(func() error {
			if err := s.Held.Err(); err != nil {
				return fmt.Errorf("pruning plan %s: %w", id, err)
			}
			if err := s.kv.Purge(ctx, k); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("pruning plan %s: %w", id, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return size, err
	}
	if err := s.Held.Err(); err != nil {
		return size, fmt.Errorf("pruning plan %s: %w", id, err)
	}
	if err := s.kv.Purge(ctx, PlanKey(id)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return size, fmt.Errorf("pruning plan %s: %w", id, err)
	}
	return size, nil
}

// PruneKeys removes the input keys whose plan the store no longer holds,
// except those still referred to: by a module of a plan it holds (one
// settled unchanged reuses the key it was addressed by), or by a module's
// current image (current.<module>: a key built to that module's current
// digest keeps it settling unchanged while its inputs stay the same,
// however old the plan that built it). It returns the records it removed,
// by input key.
func (s *Store) PruneKeys(ctx context.Context) (map[string]KeyRecord, error) {
	plans := map[string]bool{}
	if err := s.each(ctx, keyPlan+"*", func(key string, _ []byte) error {
		p, _ := planOfKey(key)
		plans[p] = true
		return nil
	}); err != nil {
		return nil, err
	}
	used := map[string]bool{}
	if err := s.each(ctx, keyModule+">", func(key string, data []byte) error {
		var m ModuleStatus
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("decoding %s: %w", key, err)
		}
		used[m.Key] = true
		return nil
	}); Readable(err, nil) != nil {
		// An unreadable module's input key may go: at worst it is
		// built again once, not cut off.
		return nil, err
	}
	currents, err := s.Currents(ctx)
	if Readable(err, nil) != nil {
		return nil, err
	}
	keys, err := s.Keys(ctx)
	if Readable(err, nil) != nil {
		return nil, err
	}
	removed := map[string]KeyRecord{}
	for k, r := range keys {
		cur, ok := currents[r.Module]
		switch {
		case plans[r.Plan], used[k], ok && cur.Digest == r.Digest:
			continue
		}
		if err := s.Held.Err(); err != nil {
			return removed, fmt.Errorf("pruning input key %s of plan %s: %w", k, r.Plan, err)
		}
		if err := s.kv.Purge(ctx, InputKeyKey(k)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return removed, fmt.Errorf("pruning input key %s of plan %s: %w", k, r.Plan, err)
		}
		removed[k] = r
	}
	return removed, nil
}
