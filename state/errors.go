package state

import "errors"

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

// codes name the sentinels on the wire.
var codes = map[string]error{
	"not-issued": ErrNotIssued, "read-only": ErrReadOnly, "too-large": ErrValueTooLarge,
	"bucket-full": ErrBucketFull, "credential": ErrCredential, "not-found": ErrNotFound,
	"invalid-key": ErrInvalidKey, "protocol": ErrProtocol,
}

// codeOf is the wire code of err's sentinel, "" for any other error.
func codeOf(err error) string {
	for c, s := range codes {
		if errors.Is(err, s) {
			return c
		}
	}
	return ""
}

// wireError is an error that came over the socket: its message as the
// runtime wrote it, matching the sentinel its code names.
type wireError struct {
	msg      string
	sentinel error
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.sentinel }

func fromWire(code, msg string) error {
	return &wireError{msg: msg, sentinel: codes[code]}
}
