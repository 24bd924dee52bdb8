package cascade

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A module's estimate is stored again only when it moved by more than a
// tenth or EstimateSlack: the first one always.
func TestEstimateMoved(t *testing.T) {
	for _, c := range []struct {
		stored, now time.Duration
		want        bool
	}{
		{0, time.Millisecond, true},
		{time.Millisecond, 3 * time.Millisecond, false},
		{time.Second, 1400 * time.Millisecond, false},
		{time.Second, 1600 * time.Millisecond, true},
		{time.Second, 400 * time.Millisecond, true},
		{time.Minute, 65 * time.Second, false},
		{time.Minute, 67 * time.Second, true},
		{time.Minute, 53 * time.Second, true},
	} {
		if got := estimateMoved(c.stored, c.now); got != c.want {
			t.Errorf("estimateMoved(%s, %s) = %v, want %v", c.stored, c.now, got, c.want)
		}
	}
}

// A cluster that cannot place an R3 bucket yet (a peer not seen online as
// the cluster starts: "no suitable peers for placement, peer offline", seen
// in CI as a cluster's controller started) or whose JetStream is not
// available is a bus to wait for, as one electing leaders; a refusal stays
// one. (Pure classification: a real cluster places R3 on two of three
// peers, so the refusal could not be provoked on demand.)
func TestAClusterThatCannotPlaceYetIsWaitedFor(t *testing.T) {
	wrap := func(err error) error {
		return fmt.Errorf("asserting bucket build-controller_declarations (state): %w", err)
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{wrap(&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}), true},
		{wrap(&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), true},
		{wrap(context.DeadlineExceeded), true},
		{wrap(jetstream.ErrNoStreamResponse), true},
		{wrap(&jetstream.APIError{Code: 500, ErrorCode: 10074, Description: "replicas > 1 not supported in non-clustered mode"}), false},
		{wrap(jetstream.ErrStreamNameAlreadyInUse), false},
		{errors.New("refused"), false},
	} {
		if got := unanswered(c.err); got != c.want {
			t.Errorf("unanswered(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
