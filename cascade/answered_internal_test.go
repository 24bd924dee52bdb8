package cascade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// Each step of a controller's start waits for a bus that does not answer
// (a timeout, no responders, a connection reconnecting) and goes on once it
// does; a refusal is returned at once, and so is the last error when the
// controller is stopped meanwhile. Before, a step after the raise (binding
// the given-up asks' consumer, loading a stored plan) met an outage with
// its error: the controller stopped, or left the plan unloaded
// (TestCrashAnywhere, seed 1796533544324634752 with 60 plans).
func TestAStartingControllerWaitsForTheBus(t *testing.T) {
	c := &Controller{log: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	tries := 0
	err := c.answered(ctx, "a step", func() error {
		tries++
		switch tries {
		case 1:
			return fmt.Errorf("binding: %w", context.DeadlineExceeded)
		case 2:
			return nats.ErrConnectionReconnecting
		case 3:
			return nats.ErrNoResponders
		}
		return nil
	})
	if err != nil || tries != 4 {
		t.Fatalf("answered: %v after %d tries, want nil after 4", err, tries)
	}

	refused := errors.New("permissions violation")
	tries = 0
	if err := c.answered(ctx, "a step", func() error { tries++; return refused }); !errors.Is(err, refused) || tries != 1 {
		t.Fatalf("a refusal: %v after %d tries, want it at once", err, tries)
	}

	stopped, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	tries = 0
	err = c.answered(stopped, "a step", func() error { tries++; return nats.ErrTimeout })
	if !errors.Is(err, nats.ErrTimeout) || stopped.Err() == nil {
		t.Fatalf("stopped while the bus is away: %v after %d tries, want its last error once stopped", err, tries)
	}
}
