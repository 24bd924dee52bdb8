package state

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/kvsnap"
	"github.com/meshbuild/meshbuild/mesh"
)

// Surface is the state surface a module uses: a Store in process, a Client
// over the node runtime's socket out of process.
type Surface interface {
	Get(ctx context.Context, bucket, key string) (Entry, error)
	Put(ctx context.Context, bucket, key string, value []byte) (uint64, error)
	Delete(ctx context.Context, bucket, key string) error
	Keys(ctx context.Context, bucket string) ([]string, error)
	Watch(ctx context.Context, bucket string) (*Watcher, error)
}

// Entry is one key's current value.
type Entry struct {
	Bucket   string    `json:"bucket"`
	Key      string    `json:"key"`
	Value    []byte    `json:"value"`
	Revision uint64    `json:"revision"`
	Created  time.Time `json:"created"`
}

// Store serves one module the buckets it was issued. It is safe for
// concurrent use; the runtime reissues it when a new declaration changes the
// module's buckets.
type Store struct {
	js     jetstream.JetStream
	module string

	mu     sync.Mutex
	issued map[string]mesh.IssuedBucket
	kvs    map[string]jetstream.KeyValue
	snaps  map[string]*kvsnap.Bucket
}

var _ Surface = (*Store)(nil)

// New returns module's state surface over js, serving the buckets issued.
func New(js jetstream.JetStream, module string, issued []mesh.IssuedBucket) *Store {
	s := &Store{js: js, module: module, kvs: map[string]jetstream.KeyValue{}, snaps: map[string]*kvsnap.Bucket{}}
	s.Reissue(issued)
	return s
}

// Reissue replaces the buckets the module may use: the runtime calls it when
// a newer declaration is applied.
func (s *Store) Reissue(issued []mesh.IssuedBucket) {
	m := make(map[string]mesh.IssuedBucket, len(issued))
	for _, b := range issued {
		m[b.Name] = b
	}
	s.mu.Lock()
	s.issued = m
	s.mu.Unlock()
}

// Module is the module the store serves.
func (s *Store) Module() string { return s.module }

// Issued returns the buckets the module may use, by name.
func (s *Store) Issued() []mesh.IssuedBucket {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]mesh.IssuedBucket, 0, len(s.issued))
	for _, b := range s.issued {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// bucket looks up an issued bucket by the module's name for it and binds it;
// write asks for a bucket the module may write. The refusals are the
// runtime's, made before anything reaches the server.
func (s *Store) bucket(ctx context.Context, name string, write bool) (jetstream.KeyValue, mesh.IssuedBucket, error) {
	s.mu.Lock()
	b, ok := s.issued[name]
	names := make([]string, 0, len(s.issued))
	for n := range s.issued {
		names = append(names, n)
	}
	kv := s.kvs[b.Bucket]
	s.mu.Unlock()
	if !ok {
		sort.Strings(names)
		issued := "none"
		if len(names) > 0 {
			issued = strings.Join(names, ", ")
		}
		return nil, b, fmt.Errorf("%w: module %s was not issued a bucket %q (issued: %s): declare it under state, or another module's under reads as <module>.<bucket>",
			ErrNotIssued, s.module, name, issued)
	}
	if write && !b.Write {
		return nil, b, fmt.Errorf("%w: module %s reads %q and may not write it: only its owner's instances write it",
			ErrReadOnly, s.module, name)
	}
	if kv != nil {
		return kv, b, nil
	}
	kv, err := s.js.KeyValue(ctx, b.Bucket)
	if err != nil {
		return nil, b, fmt.Errorf("opening bucket %q (%s): %w", name, b.Bucket, err)
	}
	s.mu.Lock()
	s.kvs[b.Bucket] = kv
	s.mu.Unlock()
	return kv, b, nil
}

// Get returns the current value of key in bucket; ErrNotFound when there is
// none.
func (s *Store) Get(ctx context.Context, bucket, key string) (Entry, error) {
	kv, _, err := s.bucket(ctx, bucket, false)
	if err != nil {
		return Entry{}, err
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		return Entry{}, wrap("reading", bucket, key, err)
	}
	return Entry{Bucket: bucket, Key: e.Key(), Value: e.Value(), Revision: e.Revision(), Created: e.Created()}, nil
}

// Put writes value under key in bucket and returns its revision. It refuses
// a bucket the module only reads, a value over the limit and a value with a
// credential-named field.
func (s *Store) Put(ctx context.Context, bucket, key string, value []byte) (uint64, error) {
	kv, b, err := s.bucket(ctx, bucket, true)
	if err != nil {
		return 0, err
	}
	if err := CheckValue(value); err != nil {
		return 0, fmt.Errorf("writing %s in %q: %w", key, bucket, err)
	}
	rev, err := kv.Put(ctx, key, value)
	if err != nil {
		if full := s.full(ctx, b, len(value), err); full != nil {
			return 0, full
		}
		return 0, wrap("writing", bucket, key, err)
	}
	return rev, nil
}

// errCodeStoreFailed is the server's code for a message it could not store
// (a stream at its byte limit among the reasons).
const errCodeStoreFailed jetstream.ErrorCode = 10077

// full explains a write the server refused for want of room: the bucket's
// bytes and the value would pass the bucket's limit.
func (s *Store) full(ctx context.Context, b mesh.IssuedBucket, n int, err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeStoreFailed {
		return nil
	}
	st, serr := s.js.Stream(ctx, mesh.KVStream(b.Bucket))
	if serr != nil {
		return nil
	}
	info := st.CachedInfo()
	if info.Config.MaxBytes <= 0 || info.State.Bytes+uint64(n) < uint64(info.Config.MaxBytes) {
		return nil
	}
	return fmt.Errorf("%w: bucket %q holds %d bytes and the limit is %s a bucket (ADR 0201): delete keys it no longer needs",
		ErrBucketFull, b.Name, info.State.Bytes, size(int(info.Config.MaxBytes)))
}

// Delete deletes key from bucket (its owner's instances only).
func (s *Store) Delete(ctx context.Context, bucket, key string) error {
	kv, _, err := s.bucket(ctx, bucket, true)
	if err != nil {
		return err
	}
	if err := kv.Delete(ctx, key); err != nil {
		return wrap("deleting", bucket, key, err)
	}
	return nil
}

// Keys returns every key with a value in bucket, sorted; none is an empty
// list, not an error.
func (s *Store) Keys(ctx context.Context, bucket string) ([]string, error) {
	kv, _, err := s.bucket(ctx, bucket, false)
	if err != nil {
		return nil, err
	}
	keys, err := s.snap(kv).Keys(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing %q: %w", bucket, err)
	}
	return keys, nil
}

// snap is the reader of every key of kv (kvsnap), one per bucket.
func (s *Store) snap(kv jetstream.KeyValue) *kvsnap.Bucket {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.snaps[kv.Bucket()]
	if b == nil {
		b = kvsnap.New(s.js, kv)
		s.snaps[kv.Bucket()] = b
	}
	return b
}

// Watch watches bucket: the current values first (no deletions), then one
// Current event, then every change, until Stop (or ctx is done).
func (s *Store) Watch(ctx context.Context, bucket string) (*Watcher, error) {
	kv, _, err := s.bucket(ctx, bucket, false)
	if err != nil {
		return nil, err
	}
	kw, err := s.snap(kv).Watch(context.WithoutCancel(ctx), nil)
	if err != nil {
		return nil, fmt.Errorf("watching %q: %w", bucket, err)
	}
	return watchKV(ctx, bucket, kw), nil
}

func wrap(op, bucket, key string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("%s %s in %q: %w", op, key, bucket, ErrNotFound)
	case errors.Is(err, jetstream.ErrInvalidKey):
		return fmt.Errorf("%s %q in %q: %w: a key is dot-separated tokens of letters, digits, '-', '_', '/', '=' (%v)", op, key, bucket, ErrInvalidKey, err)
	}
	return fmt.Errorf("%s %s in %q: %w", op, key, bucket, err)
}
