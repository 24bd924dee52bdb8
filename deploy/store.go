package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/kvsnap"
	"github.com/meshbuild/meshbuild/seat"
)

// The fleet's state lives in the controller module's declared bucket (state:
// declarations), one key per fact:
//
//	node.<node>      NodeRecord: who enrolled the name, from which machine
//	assign.<module>  Assignment: the nodes a module is assigned to
//	decl.<node>      Declaration: the newest declaration composed for the node
//	status.<node>    Status: the node's last report of a declaration
//
// Heartbeats are not stored: the controller keeps the last one in memory.
const (
	// StateBucket is the controller module's bucket the fleet lives in.
	StateBucket = "declarations"

	keyNode   = "node."
	keyAssign = "assign."
	keyDecl   = "decl."
	keyStatus = "status."
)

// NodeKey, AssignKey, DeclKey and StatusKey derive the keys of a node's
// record, a module's assignment, a node's declaration and its status.
func NodeKey(node string) string     { return keyNode + node }
func AssignKey(module string) string { return keyAssign + module }
func DeclKey(node string) string     { return keyDecl + node }
func StatusKey(node string) string   { return keyStatus + node }

// NodeRecord is an enrolled node.
type NodeRecord struct {
	Node      string    `json:"node"`
	Identity  string    `json:"identity"`
	Platforms []string  `json:"platforms,omitempty"`
	Enrolled  time.Time `json:"enrolled"`
	Updated   time.Time `json:"updated"`
}

// Assignment is the nodes a module is assigned to.
type Assignment struct {
	Module  string    `json:"module"`
	Nodes   []string  `json:"nodes"`
	Updated time.Time `json:"updated"`
}

// Status is a node's last report about a declaration.
type Status struct {
	Node     string          `json:"node"`
	Kind     string          `json:"kind"`
	Revision uint64          `json:"revision"`
	Applied  uint64          `json:"applied"`
	Modules  []AppliedModule `json:"modules,omitempty"`
	Reason   string          `json:"reason,omitempty"`
	Took     time.Duration   `json:"took,omitempty"`
	At       time.Time       `json:"at"`
}

// Store reads and writes the fleet's state in the bucket.
type Store struct {
	kv   jetstream.KeyValue
	snap *kvsnap.Bucket
	// held, if set, is asked before each write: none is made once it says
	// the writer no longer holds its seat (Controller.SetHeld).
	held claim.Holding
}

// OpenStore binds the controller module's declarations bucket.
func OpenStore(ctx context.Context, js jetstream.JetStream, controllerModule string) (*Store, error) {
	kv, err := seat.OpenBucket(ctx, js, controllerModule, StateBucket)
	if err != nil {
		return nil, err
	}
	return &Store{kv: kv, snap: kvsnap.New(js, kv)}, nil
}

// KV is the bucket.
func (s *Store) KV() jetstream.KeyValue { return s.kv }

func (s *Store) put(ctx context.Context, key string, v any) error {
	if err := s.held.Err(); err != nil {
		return fmt.Errorf("writing %s: %w", key, err)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", key, err)
	}
	if _, err := s.kv.Put(ctx, key, data); err != nil {
		return fmt.Errorf("writing %s: %w", key, err)
	}
	return nil
}

// Nodes returns every enrolled node, by name.
func (s *Store) Nodes(ctx context.Context) (map[string]NodeRecord, error) {
	return each[NodeRecord](ctx, s.snap, keyNode)
}

// Assignments returns every assignment, by module.
func (s *Store) Assignments(ctx context.Context) (map[string]Assignment, error) {
	return each[Assignment](ctx, s.snap, keyAssign)
}

// Declarations returns every node's newest declaration, by node.
func (s *Store) Declarations(ctx context.Context) (map[string]Declaration, error) {
	return each[Declaration](ctx, s.snap, keyDecl)
}

// Statuses returns every node's last report, by node.
func (s *Store) Statuses(ctx context.Context) (map[string]Status, error) {
	return each[Status](ctx, s.snap, keyStatus)
}

// each decodes the current value of every key under prefix, by the rest of
// the key: every key that has a value, also while the bucket is written
// (kvsnap).
func each[T any](ctx context.Context, snap *kvsnap.Bucket, prefix string) (map[string]T, error) {
	vals, err := snap.Values(ctx, prefix+"*")
	if err != nil {
		return nil, fmt.Errorf("reading %s*: %w", prefix, err)
	}
	out := make(map[string]T, len(vals))
	for k, e := range vals {
		var v T
		if err := json.Unmarshal(e.Value(), &v); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", k, err)
		}
		out[strings.TrimPrefix(k, prefix)] = v
	}
	return out, nil
}

// Deleted reports whether err says a key is gone.
func isNotFound(err error) bool { return errors.Is(err, jetstream.ErrKeyNotFound) }
