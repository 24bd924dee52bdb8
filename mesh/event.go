package mesh

import (
	"encoding/json"
	"errors"
	"fmt"
)

// PushedVersion is the version of mesh-git's pushed event this code speaks.
const PushedVersion = 1

var (
	// ErrMalformedEvent is wrapped when an event's payload cannot be read.
	ErrMalformedEvent = errors.New("malformed event")
	// ErrEventVersion is wrapped when an event's version is not the one
	// this code speaks.
	ErrEventVersion = errors.New("unknown event version")
)

// Event is an event payload of the mesh's contract: each carries a version
// and is read with DecodeEvent.
type Event interface {
	Pushed | Started | Built | Failed | HandedBack
}

// versioned is what DecodeEvent checks: the version an event carries and
// the one this code speaks.
type versioned interface {
	versions() (have, want int)
}

func (e Pushed) versions() (int, int)     { return e.Version, PushedVersion }
func (e Started) versions() (int, int)    { return e.Version, AskVersion }
func (e Built) versions() (int, int)      { return e.Version, AskVersion }
func (e Failed) versions() (int, int)     { return e.Version, AskVersion }
func (e HandedBack) versions() (int, int) { return e.Version, AskVersion }

// DecodeEvent parses an event and checks its version, as DecodeAsk does
// for asks: every error wraps ErrMalformedEvent or ErrEventVersion, and
// names the event's type. E.g. DecodeEvent[mesh.Built](msg.Data()).
func DecodeEvent[E Event](data []byte) (E, error) {
	var e E
	if err := json.Unmarshal(data, &e); err != nil {
		return e, fmt.Errorf("%w: %T: %v", ErrMalformedEvent, e, err)
	}
	if have, want := any(e).(versioned).versions(); have != want {
		return e, fmt.Errorf("%w: %T version %d, this code speaks %d", ErrEventVersion, e, have, want)
	}
	return e, nil
}
