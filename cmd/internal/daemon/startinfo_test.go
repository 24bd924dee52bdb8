package daemon

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// infoCounter counts the requests of the JetStream API's info queue
// (nats-server's infopairs: account, stream and consumer infos, names and
// lists) it sees until the first pull of the build seat's consumer.
type infoCounter struct {
	mu     sync.Mutex
	infos  []string
	pulled bool
}

func (c *infoCounter) see(m *nats.Msg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch s := m.Subject; {
	case c.pulled:
	case strings.HasPrefix(s, "$JS.API.CONSUMER.MSG.NEXT."+mesh.SeatStream(mesh.BuildSeat)+"."):
		c.pulled = true
	case s == "$JS.API.INFO", strings.HasPrefix(s, "$JS.API.STREAM.INFO."), strings.HasPrefix(s, "$JS.API.CONSUMER.INFO."),
		s == "$JS.API.STREAM.NAMES", s == "$JS.API.STREAM.LIST",
		strings.HasPrefix(s, "$JS.API.CONSUMER.NAMES."), strings.HasPrefix(s, "$JS.API.CONSUMER.LIST."):
		c.infos = append(c.infos, s)
	}
}

func (c *infoCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.infos, c.pulled = nil, false
}

func (c *infoCounter) read() ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.infos...), c.pulled
}

// A build machine starting, and one taking its seat back after the
// server's restart, asks the JetStream API's info queue at most
// mesh.StartInfoRequests times before it pulls: the figure the server's
// queue limit for a fleet starting at once is derived from
// (mesh.FleetSettingsOf's APIQueueLimit). A server whose queue is full
// drops every request in it. Once bound, the consumers of platforms the
// catalogue does not build are asked for once a FetchWait.
func TestAStartAsksTheInfoQueueAtMostStartInfoRequests(t *testing.T) {
	bk := testenv.Buildkitd(t)
	srv, _ := raisedRestartable(t)
	nc, _ := natstest.Connect(t, srv.s)
	var c infoCounter
	sub, err := nc.Subscribe("$JS.API.>", c.see)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var log testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := startAgent(t, ctx, "m1", AgentOptions{NATS: srv.s.ClientURL(), BuildKit: bk,
		Lease: 2 * time.Second, Log: slog.New(slog.NewTextHandler(&log, nil))})
	check := func(when string) {
		t.Helper()
		testenv.WaitFor(t, 30*time.Second, "the agent to pull "+when, func() bool {
			select {
			case err := <-done:
				t.Fatalf("the agent stopped: %v\n%s", err, log.String())
			default:
			}
			_, pulled := c.read()
			return pulled
		})
		infos, _ := c.read()
		t.Logf("%s: %d info requests before the first pull: %v", when, len(infos), infos)
		if len(infos) > mesh.StartInfoRequests {
			t.Errorf("%s: %d info requests before the first pull, more than mesh.StartInfoRequests (%d): %v", when, len(infos), mesh.StartInfoRequests, infos)
		}
	}
	check("as it starts")

	// Bound, it asks for the consumers of its other platforms, which the
	// catalogue does not build, once a FetchWait (5 s here) each, not at
	// the pace of its start's retries (250 ms, doubling).
	var polls infoCounter
	psub, err := nc.Subscribe("$JS.API.CONSUMER.INFO.>", polls.see)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	psub.Unsubscribe()
	got, _ := polls.read()
	each := map[string]int{}
	for _, s := range got {
		each[s]++
	}
	for s, n := range each {
		if n > 1 {
			t.Errorf("in 4 s once bound, %s asked %d times, want once a FetchWait (5 s) at most", s, n)
		}
	}
	t.Logf("in 4 s once bound: %v", each)

	c.reset()
	srv.stop()
	awaitLog(t, "the agent to say its claim lapsed", &log, done, "the claim lapsed")
	srv.start()
	check("after the server's restart")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunAgent: %v", err)
	}
}
