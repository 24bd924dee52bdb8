package cli_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// instant "builds" every ask at once with a digest of its id: the agent
// loop, the queue and the controller are real; what is under test is what
// `builds machines` counts.
type instant struct{}

func (instant) Work(_ context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
	h := sha256.Sum256([]byte(a.ID))
	d := "sha256:" + hex.EncodeToString(h[:])
	return agent.Result{Digest: d, Ref: a.Image + "@" + d}, nil
}

// `builds machines` counts what each machine built from the plans the
// controller keeps: an agent that restarts is online again with the count
// it had, not zero (its own counters start again).
func TestMachinesKeepTheirCountsWhenAnAgentRestarts(t *testing.T) {
	s, ctx, _ := runFleetController(t)
	url := s.ClientURL()
	startAgent := func() (stop func()) {
		_, js := natstest.Connect(t, s)
		cfg := agent.DefaultConfig()
		cfg.Machine, cfg.FetchWait = "m1", 200*time.Millisecond
		a, err := agent.New(cfg, js, instant{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(actx) }()
		return func() { acancel(); <-done }
	}
	machine := func() cli.Machine {
		t.Helper()
		for _, m := range machines(t, url) {
			if m.Machine == "m1" {
				return m
			}
		}
		return cli.Machine{}
	}

	stop := startAgent()
	code, out, errw := run(t, "--nats", url, "rebuild", "--id", "m1", "base")
	if code != 0 {
		t.Fatalf("rebuild: exit %d\n%s\n%s", code, out, errw)
	}
	plan := strings.TrimSuffix(strings.Fields(out)[1], ":")
	testenv.WaitFor(t, 60*time.Second, "the plan built", func() bool {
		code, out, _ := run(t, "--nats", url, "--json", "show", plan)
		return code == 0 && strings.Contains(out, `"outcome": "built"`)
	})
	before := machine()
	if !before.Online || before.Built == 0 {
		t.Fatalf("m1 before its restart: %+v, want online with what it built", before)
	}
	stop()
	stop = startAgent()
	defer stop()
	var after cli.Machine
	testenv.WaitFor(t, 30*time.Second, "m1 online again", func() bool { after = machine(); return after.Online })
	if after.Built != before.Built || after.Failed != before.Failed {
		t.Fatalf("m1 after its restart built %d, failed %d; before %d, %d: want the counts kept", after.Built, after.Failed, before.Built, before.Failed)
	}
}
