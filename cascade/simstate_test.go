package cascade

// The plan state machine run through the simulator's DAGs: State releases
// asks in the order the simulator's policies model (package sim), so the
// benchmarks' pure figures are State's.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade/sim"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

// simulateState runs a plan through State itself on machines pulling FIFO
// from one queue, asks entering the queue in the order State returns them
// (calling Fill after each started, as the controller does), each build
// taking dur[module] seconds (missing: 1). setup, if not nil, configures the
// new State (estimates, window). It returns the makespan in seconds; it errs
// if the plan does not finish.
func simulateState(p planner.Plan, dur map[string]float64, machines int, setup func(*State)) (float64, error) {
	return simulateStateProbed(p, dur, machines, setup, nil, nil)
}

// simulateStateProbed is simulateState calling probe with the state as it
// stands at each of the times probes (in seconds, ascending), before the
// first event after it; at is the probe's time.
func simulateStateProbed(p planner.Plan, dur map[string]float64, machines int, setup func(*State),
	probes []float64, probe func(s *State, at time.Time)) (float64, error) {
	if machines < 1 {
		return 0, fmt.Errorf("simulating plan %s: no machine", p.ID)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(x float64) time.Time { return t0.Add(time.Duration(x * float64(time.Second))) }
	s := NewState(p, t0)
	if setup != nil {
		setup(s)
	}
	// Completions at one instant are handled in name order, as Simulate does.
	names := p.Names()
	slices.Sort(names)
	pos := make(map[string]int, len(names))
	for i, name := range names {
		pos[name] = i
	}
	length := func(module string) float64 {
		if v, ok := dur[module]; ok {
			return v
		}
		return 1
	}

	var queue []Submit
	queue = append(queue, s.Start(t0)...)
	var running completions
	asks := map[int]Submit{}
	free, now := machines, 0.0
	for {
		for free > 0 && len(queue) > 0 {
			sub := queue[0]
			queue = queue[1:]
			i := pos[sub.Module]
			s.Started(mesh.Started{Version: 1, Ask: sub.AskID, Plan: sub.Plan, Module: sub.Module, On: "sim", Attempt: sub.Attempt, At: at(now)})
			queue = append(queue, s.Fill(at(now))...)
			asks[i] = sub
			running.add(now+length(sub.Module), i)
			free--
		}
		if len(running) == 0 {
			break
		}
		for len(probes) > 0 && probes[0] < running.first().at {
			probe(s, at(probes[0]))
			probes = probes[1:]
		}
		now = running.first().at
		for len(running) > 0 && running.first().at == now {
			e := running.pop()
			free++
			sub := asks[e.node]
			queue = append(queue, s.Built(mesh.Built{Version: 1, Ask: sub.AskID, Plan: sub.Plan, Module: sub.Module,
				Digest: simDigest(sub.Module), On: "sim", Duration: time.Duration(length(sub.Module) * float64(time.Second)),
				At: at(now)}, at(now))...)
		}
	}
	if o := s.Outcome(); o != OutcomeBuilt {
		return now, fmt.Errorf("simulating plan %s: outcome %s, counts %+v", p.ID, o, s.Counts())
	}
	return now, nil
}

// simDigest is a made-up digest for a module built in a test.
func simDigest(module string) string {
	sum := sha256.Sum256([]byte(module))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// completion is a build in flight: when it finishes, and its node.
type completion struct {
	at   float64
	node int
}

// completions are the builds in flight (at most one per machine).
type completions []completion

func (c *completions) add(at float64, node int) { *c = append(*c, completion{at, node}) }

// first is the build that finishes first (the lowest node at a tie).
func (c completions) first() completion { return c[c.firstIndex()] }

func (c completions) firstIndex() int {
	best := 0
	for i, e := range c {
		if e.at < c[best].at || (e.at == c[best].at && e.node < c[best].node) {
			best = i
		}
	}
	return best
}

func (c *completions) pop() completion {
	i := c.firstIndex()
	e := (*c)[i]
	*c = slices.Delete(*c, i, i+1)
	return e
}

func TestSimulateStateMatchesSimulate(t *testing.T) {
	for seed := range uint64(8) {
		d := sim.RandomLayeredDAG(200, 8, seed)
		p, err := d.Plan()
		if err != nil {
			t.Fatal(err)
		}
		dur := map[string]float64{}
		est := map[string]time.Duration{}
		for i, name := range d.Names {
			dur[name] = d.Dur[i]
			est[name] = time.Duration(d.Dur[i] * float64(time.Second))
		}
		for _, machines := range []int{1, 7, 50} {
			for _, tc := range []struct {
				name   string
				setup  func(*State)
				policy sim.Policy
			}{
				{"estimates", func(s *State) { s.SetEstimates(est) }, sim.Policy{Order: sim.Ranked}},
				{"no estimates", nil, sim.Policy{Order: sim.Ranked, UnitEstimates: true}},
				{"window 1", func(s *State) { s.SetEstimates(est); s.Window = 1 }, sim.Policy{Window: 1, Aging: Aging}},
				{"window 5", func(s *State) { s.SetEstimates(est); s.Window = 5 }, sim.Policy{Window: 5, Aging: Aging}},
				{"window 3, no estimates", func(s *State) { s.Window = 3 }, sim.Policy{Window: 3, UnitEstimates: true, Aging: Aging}},
			} {
				got, err := simulateState(p, dur, machines, tc.setup)
				if err != nil {
					t.Fatal(err)
				}
				if want := sim.Simulate(d, machines, tc.policy).Makespan; math.Abs(got-want) > 1e-6 {
					t.Errorf("seed %d on %d, %s: State gives %v, Simulate %v", seed, machines, tc.name, got, want)
				}
			}
		}
	}
	// A fan: every tie broken the same way.
	p, err := sim.Fan(35).Plan()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := simulateState(p, nil, 4, func(s *State) { s.Window = 2 }); err != nil || got != 10 {
		t.Errorf("fan through State: %v, %v", got, err)
	}
}

// BenchmarkSimulateState1000On50 runs the 1,000-module DAG through State
// itself: the release order the controller gets.
func BenchmarkSimulateState1000On50(b *testing.B) {
	d := sim.RandomLayeredDAG(1000, 10, 1)
	p, err := d.Plan()
	if err != nil {
		b.Fatal(err)
	}
	dur := map[string]float64{}
	est := map[string]time.Duration{}
	for i, name := range d.Names {
		dur[name] = d.Dur[i]
		est[name] = time.Duration(d.Dur[i] * float64(time.Second))
	}
	lb := sim.LowerBound(d, 50)
	for _, tc := range []struct {
		name  string
		setup func(*State)
	}{
		{"estimates", func(s *State) { s.SetEstimates(est) }},
		{"no-estimates", nil},
		{"estimates-window-1", func(s *State) { s.SetEstimates(est); s.Window = 1 }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var makespan float64
			for b.Loop() {
				if makespan, err = simulateState(p, dur, 50, tc.setup); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(makespan/lb, "makespan/lb")
		})
	}
}

// The simulator's model ages asks as the controller does.
func TestTheSimulatorAgesAsTheController(t *testing.T) {
	if sim.ControllerAging != Aging {
		t.Errorf("sim.ControllerAging %v, the controller's Aging %v", sim.ControllerAging, Aging)
	}
}
