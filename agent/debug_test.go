package agent_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// jsonLines are the JSON log lines written to b.
func jsonLines(b *testenv.Buffer) []map[string]any {
	var out []map[string]any
	for line := range strings.Lines(b.String()) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// At debug level an agent traces each ask it works: what claiming it found
// and how long that took (with when the server queued it and how many times
// it was delivered), its outcome announced and how long that took, and how
// it was settled with the server — each line naming the ask. At info level
// none of them is written.
func TestAnAgentTracesEachAskAtDebugLevel(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		t.Run(level.String(), func(t *testing.T) {
			s, js := bus(t)
			nc, ajs := natstest.Dial(t, s.ClientURL())
			defer nc.Close()
			cfg := agent.DefaultConfig()
			cfg.Machine = "m1"
			cfg.FetchWait = 500 * time.Millisecond
			out := &testenv.Buffer{}
			log := slog.New(slog.NewJSONHandler(out, &slog.HandlerOptions{Level: level}))
			a, err := agent.New(cfg, ajs, instant{}, log, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = a.Run(ctx) }()
			defer func() { cancel(); <-done }()
			before := time.Now().UTC()
			submit(t, js, ask("a1"))
			testenv.WaitFor(t, 10*time.Second, "a1 built", func() bool { return len(events(t, js).Built) == 1 })
			want := map[string]func(m map[string]any) string{
				"claim": func(m map[string]any) string {
					queued, err := time.Parse(time.RFC3339Nano, str(m["queued"]))
					switch {
					case m["verdict"] != "claimed":
						return "verdict " + str(m["verdict"])
					case m["delivered"] != float64(1):
						return "delivered not 1"
					case err != nil || queued.Before(before.Add(-time.Second)) || queued.After(time.Now().Add(time.Second)):
						return "queued " + str(m["queued"])
					case !positive(m["took"]):
						return "no took"
					}
					return ""
				},
				"announced": func(m map[string]any) string {
					if m["event"] != "built" || !positive(m["took"]) {
						return "event " + str(m["event"])
					}
					return ""
				},
				"settled with the server": func(m map[string]any) string {
					if m["how"] != "acknowledged" {
						return "how " + str(m["how"])
					}
					return ""
				},
			}
			var seen map[string]bool
			testenv.WaitFor(t, 5*time.Second, "the ask's lines", func() bool {
				seen = map[string]bool{}
				for _, m := range jsonLines(out) {
					check, ok := want[str(m["msg"])]
					if !ok || m["ask"] != "a1" {
						continue
					}
					if m["level"] != "DEBUG" {
						t.Fatalf("%v: written at %v", m["msg"], m["level"])
					}
					if bad := check(m); bad != "" {
						t.Fatalf("%v: %s (%v)", m["msg"], bad, m)
					}
					seen[str(m["msg"])] = true
				}
				return level == slog.LevelInfo || len(seen) == len(want)
			})
			if level == slog.LevelInfo {
				testenv.WaitFor(t, 5*time.Second, "a line saying a1 was built", func() bool {
					for _, m := range jsonLines(out) {
						if m["msg"] == "built" && m["ask"] == "a1" {
							return true
						}
					}
					return false
				})
				for _, m := range jsonLines(out) {
					if _, traced := want[str(m["msg"])]; traced {
						t.Fatalf("at info level, a debug line was written: %v", m)
					}
				}
			}
		})
	}
}

// positive: a duration the JSON handler wrote (nanoseconds) above 0.
func positive(v any) bool {
	f, ok := v.(float64)
	return ok && f > 0
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
