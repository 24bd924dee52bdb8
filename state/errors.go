package state

import (
	"errors"

	"github.com/meshbuild/meshbuild/seat"
)

// Sentinel errors: every refusal wraps one, so a caller matches it with
// errors.Is — in process, or across the socket (the protocol carries the
// code and Dial's client maps it back).
var (
	// ErrNotIssued: the module was not issued a bucket by that name.
	ErrNotIssued = errors.New("bucket not issued")
	// ErrReadOnly: a write to a bucket the module only reads.
	ErrReadOnly = errors.New("bucket is read-only")
	// ErrValueTooLarge: a value over the mesh's limit a value.
	ErrValueTooLarge = errors.New("value over the limit")
	// ErrBucketFull: a bucket at the mesh's limit a bucket.
	ErrBucketFull = errors.New("bucket full")
	// ErrCredential: a value with a credential-named field.
	ErrCredential = errors.New("credential in a value")
	// ErrNotFound: no value under the key.
	ErrNotFound = errors.New("key not found")
	// ErrInvalidKey: a key that is not a valid key-value key.
	ErrInvalidKey = errors.New("invalid key")
	// ErrProtocol: a request or answer on the socket that cannot be used.
	ErrProtocol = errors.New("state protocol error")
)

// codes name the sentinels on the wire, in order (seat.Codes): an error
// wrapping two has the code of the first.
var codes = seat.Codes{
	{Code: "not-issued", Sentinels: []error{ErrNotIssued}},
	{Code: "read-only", Sentinels: []error{ErrReadOnly}},
	{Code: "too-large", Sentinels: []error{ErrValueTooLarge}},
	{Code: "bucket-full", Sentinels: []error{ErrBucketFull}},
	{Code: "credential", Sentinels: []error{ErrCredential}},
	{Code: "not-found", Sentinels: []error{ErrNotFound}},
	{Code: "invalid-key", Sentinels: []error{ErrInvalidKey}},
	{Code: "protocol", Sentinels: []error{ErrProtocol}},
}

// codeOf is the wire code of err's sentinel, "" for any other error.
func codeOf(err error) string { return codes.Of(err) }

// fromWire is an error that came over the socket: its message as the
// runtime wrote it, matching the sentinel its code names.
func fromWire(code, msg string) error { return codes.Error(code, msg) }
