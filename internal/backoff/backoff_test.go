package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDelayDoublesWithinJitterAndIsCapped(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Max: time.Second}
	for attempt, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		for range 50 {
			d := p.Delay(attempt)
			if d < want/2 || d > want {
				t.Fatalf("Delay(%d) = %s, want in [%s, %s]", attempt, d, want/2, want)
			}
		}
	}
	if d := p.Delay(1000); d < p.Max/2 || d > p.Max {
		t.Errorf("Delay(1000) = %s, want capped at %s", d, p.Max)
	}
	if d := (Policy{}).Delay(0); d < DefaultBase/2 || d > DefaultBase {
		t.Errorf("zero policy Delay(0) = %s, want about %s", d, DefaultBase)
	}
}

func TestSleepHonoursTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (Policy{Base: time.Hour, Max: time.Hour}).Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on a done context: %v, want context.Canceled", err)
	}
	if err := (Policy{Base: time.Millisecond, Max: time.Millisecond}).Sleep(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
}
