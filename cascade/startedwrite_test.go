package cascade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/sim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// moduleWrites records every write of a plan's module records, by module:
// the states in the order the store took them.
type moduleWrites struct {
	mu     sync.Mutex
	states map[string][]cascade.ModuleState
}

// watchModuleWrites watches every module record of every plan in f's store
// from now on (each write, not only the last).
func watchModuleWrites(t *testing.T, f *benchFarm) *moduleWrites {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := f.kv.Watch(ctx, cascade.ModulesOf("*"), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	mw := &moduleWrites{states: map[string][]cascade.ModuleState{}}
	go func() {
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var ms cascade.ModuleStatus
			if json.Unmarshal(e.Value(), &ms) != nil {
				continue
			}
			mw.mu.Lock()
			mw.states[ms.Module] = append(mw.states[ms.Module], ms.State)
			mw.mu.Unlock()
		}
	}()
	return mw
}

// buildingWrites is how many writes of module stored it building.
func (mw *moduleWrites) buildingWrites(module string) int {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	n := 0
	for _, s := range mw.states[module] {
		if s == cascade.Building {
			n++
		}
	}
	return n
}

func (mw *moduleWrites) String() string {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	return fmt.Sprint(mw.states)
}

// TestAShortBuildsStartedAndBuiltAreOneWrite: with the default
// StartedStoreDelay, a build that ends within it is stored once built — its
// started never written on its own — while one that runs longer is stored
// building before it is built; with the delay off a started is its own
// write. Real server, controller and agents; the builds sleep.
func TestAShortBuildsStartedAndBuiltAreOneWrite(t *testing.T) {
	d := sim.Fan(6)
	// m1 runs well past the delay; the others take 50 ms: their started
	// and built come in two batches of the controller's (zero-length
	// builds' often come in one, and are one write either way).
	const unit = 3 * cascade.DefaultStartedStoreDelay
	d.Dur[1] = 1
	for i := 2; i < d.Len(); i++ {
		d.Dur[i] = float64(50*time.Millisecond) / float64(unit)
	}
	for _, delay := range []time.Duration{0, -1} {
		t.Run(fmt.Sprintf("delay=%v", delay), func(t *testing.T) {
			cfg := cascade.DefaultConfig()
			if delay != 0 {
				cfg.StartedStoreDelay = delay
			}
			// The agents announce started at once (their StartedDelay
			// would leave the short builds' unsent): this is the
			// controller's delay.
			f := newBenchFarmWith(t, benchCatalogue(t, d), cfg, 3, 1, func(c *agent.Config) { c.StartedDelay = 0 })
			writes := watchModuleWrites(t, f)
			r := f.run(d, unit, time.Minute)
			mods := f.modules(t, r.Rec.ID)
			short, shortBuilding := 0, 0
			for i, name := range d.Names {
				if mods[name].State != cascade.Built {
					t.Fatalf("%s: %s, want built", name, mods[name].State)
				}
				n := writes.buildingWrites(name)
				switch {
				case i == 0:
				case i == 1:
					// Longer than the delay: the store says it is
					// building while it builds, whatever the delay.
					if n == 0 {
						t.Errorf("%s built for %s and was never stored building: %s", name, unit, writes)
					}
				default:
					short++
					if n > 0 {
						shortBuilding++
					}
				}
			}
			// Under load a build may stall past the delay, or a batch
			// hold both events: most must go as the delay says.
			if delay < 0 && shortBuilding*2 <= short {
				t.Errorf("with the delay off, %d of the %d short builds were stored building, want most: %s", shortBuilding, short, writes)
			}
			if delay == 0 && shortBuilding*2 >= short {
				t.Errorf("%d of the %d short builds were stored building, want their started and built one write: %s", shortBuilding, short, writes)
			}
		})
	}
}

// TestAStartedWaitingForItsWriteIsGivenBackOnStop: a controller that stops
// while a started waits for its write gives the event back at once (not
// left unacknowledged for the consumer's ack wait), and the next
// controller stores the module building (the event delivered again, and
// replayed as it resumes). Nothing is lost: the store never said building
// before the stop, and says it after, while the build goes on.
func TestAStartedWaitingForItsWriteIsGivenBackOnStop(t *testing.T) {
	d := sim.Fan(1)
	d.Dur[0], d.Dur[1] = 0, 1
	const unit = 20 * time.Second
	cat := benchCatalogue(t, d)
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	f := &benchFarm{tb: t, s: s, js: js, work: &sleeper{}, slots: 1}
	f.work.dur.Store(&map[string]time.Duration{})
	f.stops = append(f.stops, func() { s.Shutdown(); s.WaitForShutdown() })
	t.Cleanup(f.Close)

	first := cascade.DefaultConfig()
	first.StartedStoreDelay = time.Hour // the write waits for the build
	nc, cjs := f.connect()
	f.startController(nc, cjs, cat, first, 20*time.Second, 10*time.Millisecond)
	stopFirst := f.stops[len(f.stops)-1]
	f.startAgents(f.connect, 1, nil, func(_ int, c *agent.Config) {
		c.Machine = "sim-001"
		c.FetchWait = 250 * time.Millisecond
	})
	f.waitIdle()
	writes := watchModuleWrites(t, f)

	f.work.set(d, unit)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f.push(ctx, "c1")
	// m1 is taken: the agent's slot is busy (an ask pending its ack).
	testenv.WaitFor(t, 30*time.Second, "m1 taken by the agent", func() bool {
		c, err := f.js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumAckPending == 1
	})
	// Its started is applied and waits for its write.
	time.Sleep(500 * time.Millisecond)
	if n := writes.buildingWrites("m1"); n != 0 {
		t.Fatalf("m1 stored building %d times while its write waits an hour: %s", n, writes)
	}
	stopFirst()

	nc2, cjs2 := f.connect()
	second := cascade.DefaultConfig()
	second.StartedStoreDelay = -1
	f.startController(nc2, cjs2, cat, second, 30*time.Second, 50*time.Millisecond)
	testenv.WaitFor(t, 15*time.Second, "m1 stored building by the next controller", func() bool { return writes.buildingWrites("m1") > 0 })
	// Given back: delivered again to the next controller and acknowledged
	// by it, not left to the consumer's ack wait.
	testenv.WaitFor(t, 5*time.Second, "the started given back and acknowledged", func() bool {
		c, err := f.js.Consumer(ctx, mesh.EventsStream, mesh.ModuleConsumer("build-controller"))
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumAckPending == 0
	})
}

// TestABuildShorterThanItsStartedDelayAnnouncesOnlyItsOutcome: with the
// agents' default StartedDelay, a build that ends within it announces no
// started — the stream holds its built alone — and one that runs longer
// announces started, stored before its built; the controller stores every
// module built, on its machine, with when it began (a short one's from its
// built: At less Duration) before it finished. Real server, controller
// and agents; the builds sleep.
func TestABuildShorterThanItsStartedDelayAnnouncesOnlyItsOutcome(t *testing.T) {
	d := sim.Fan(4)
	const unit = 4 * agent.DefaultStartedDelay
	for i := range d.Dur {
		d.Dur[i] = float64(20*time.Millisecond) / float64(unit)
	}
	d.Dur[1] = 1 // well past the delay
	f := newBenchFarm(t, benchCatalogue(t, d), cascade.DefaultConfig(), 2, 1)
	r := f.run(d, unit, time.Minute)
	mods := f.modules(t, r.Rec.ID)

	ctx := context.Background()
	cons, err := f.js.OrderedConsumer(ctx, mesh.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{
			mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventStarted),
			mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, mesh.EventBuilt),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(int(info.NumPending), jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var order []string // "<event> <module>", as stored
	for m := range batch.Messages() {
		var ev struct {
			Module string `json:"module"`
		}
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		_, _, event, _ := mesh.SplitHolderEventSubject(m.Subject())
		order = append(order, event+" "+ev.Module)
	}
	for i, name := range d.Names {
		started := slices.Index(order, mesh.EventStarted+" "+name)
		built := slices.Index(order, mesh.EventBuilt+" "+name)
		switch {
		case built < 0:
			t.Errorf("%s: no built in the stream: %v", name, order)
		case i == 1 && (started < 0 || started > built):
			t.Errorf("%s built for %s, longer than the agents' StartedDelay: want its started stored before its built: %v", name, unit, order)
		case i != 1 && started >= 0:
			// Under load a 20 ms build may stall past the delay; the
			// delay is 250 ms: not this far.
			t.Errorf("%s built in %s, within the agents' StartedDelay %s: want no started: %v", name, time.Duration(d.Dur[i]*float64(unit)), agent.DefaultStartedDelay, order)
		}
		m := mods[name]
		if m.State != cascade.Built || !strings.HasPrefix(m.On, "sim-") || m.Started.IsZero() || m.Started.After(m.Finished) || m.Duration <= 0 {
			t.Errorf("%s stored %s on %q, started %s, finished %s, took %s: want built on its machine, begun before it finished",
				name, m.State, m.On, m.Started, m.Finished, m.Duration)
		}
	}
}

// silentWorker is a machine killed in a build's first moments: the first
// ask it is given closes its connection (nothing more leaves it: no
// started, no outcome, no hand-back) and never ends.
type silentWorker struct {
	nc   interface{ Close() }
	once sync.Once
	took chan string
}

func (w *silentWorker) Work(ctx context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
	w.once.Do(func() {
		w.nc.Close()
		w.took <- a.Module
	})
	<-ctx.Done()
	return agent.Result{}, context.Cause(ctx)
}

// A machine that goes silent with an ask before its started is due (killed
// within agent.Config.StartedDelay of taking it: the plan never heard of
// it) is still noted lost: the machine that builds the ask next announces
// a later delivery of it, and the module keeps a lost holder whose machine
// is not known, taken by the one that built it. Its dependent, asked once,
// has none.
func TestAMachineSilentBeforeItsStartedIsNotedLost(t *testing.T) {
	d := sim.Fan(1)
	f := newBenchFarm(t, benchCatalogue(t, d), cascade.DefaultConfig(), 0, 1)
	ctx := context.Background()
	// Redelivered after a second, not the default ack wait.
	cons, err := f.js.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		t.Fatal(err)
	}
	cc := cons.CachedInfo().Config
	cc.AckWait = time.Second
	if _, err := f.js.UpdateConsumer(ctx, mesh.SeatStream(mesh.BuildSeat), cc); err != nil {
		t.Fatal(err)
	}

	nc, sjs := f.connect()
	w := &silentWorker{nc: nc, took: make(chan string, 1)}
	scfg := agent.DefaultConfig()
	scfg.Machine, scfg.FetchWait, scfg.ClaimLease = "silent", 250*time.Millisecond, time.Second
	sa, err := agent.New(scfg, sjs, w, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = sa.Run(sctx) }()
	testenv.WaitFor(t, 10*time.Second, "the silent machine's slot waiting", func() bool {
		l, err := seatLook(ctx, f.js, 0)
		return err == nil && l.Waiting >= 1
	})
	got := make(chan planRun, 1)
	go func() { got <- f.run(d, time.Millisecond, time.Minute) }()
	var first string
	select {
	case first = <-w.took:
	case <-time.After(30 * time.Second):
		t.Fatal("the silent machine was given no ask")
	}
	// Another machine, once the first is gone.
	f.startAgents(f.connect, 1, nil, func(_ int, c *agent.Config) {
		c.Machine, c.FetchWait = "sim-001", 250*time.Millisecond
	})
	r := <-got
	mods := f.modules(t, r.Rec.ID)
	for _, name := range d.Names {
		m := mods[name]
		if name != first {
			if len(m.Lost) != 0 {
				t.Errorf("%s, asked once: lost %+v, want none", name, m.Lost)
			}
			continue
		}
		if m.State != cascade.Built || m.On != "sim-001" || len(m.Lost) != 1 {
			t.Fatalf("%s %s on %q, lost %+v: want built on sim-001 with one lost holder", name, m.State, m.On, m.Lost)
		}
		if l := m.Lost[0]; l.On != "" || l.TakenBy != "sim-001" || l.Taken.IsZero() || !l.Started.IsZero() || l.Taken.After(m.Finished) {
			t.Errorf("%s lost %+v: want a machine not known, its ask taken by sim-001 before it was built (%s)", name, l, m.Finished)
		}
		if m.HeldBy("silent") {
			t.Errorf("%s held by the silent machine, which the plan never heard of", name)
		}
	}
}
