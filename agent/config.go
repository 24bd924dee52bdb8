package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
)

// ErrConfig is wrapped by every refusal of a Config.
var ErrConfig = errors.New("invalid agent config")

// Config is a build agent's configuration. DefaultConfig fills every
// default; Validate refuses what cannot work, in plain words.
type Config struct {
	// Machine names this agent in every outcome (`on`).
	Machine string
	// Slots is how many asks the agent works at once; each slot pulls one
	// ask at a time.
	Slots int
	// Overlap lets a slot pull its next ask once its build's own steps are
	// done, while the daemon exports and pushes the image and its cache
	// and the registry is asked for them (overlap.go): a slot then has two
	// builds in hand at most, one of them past its steps. Default on.
	Overlap bool
	// Platforms the agent builds: it binds the build seat's holders'
	// consumer of each, so it only ever receives asks for them. Empty means
	// every platform its BuildKit worker builds (BuildKit.Platforms, emulated
	// ones included): RunAgent fills it, and narrows the worker's to these
	// when set. An agent made by New with none builds mesh.DefaultPlatform.
	Platforms []string
	// Heartbeat is how often a slot tells the server it is still working on
	// its ask (InProgress). Zero derives it from the consumer's ack wait.
	Heartbeat time.Duration
	// Grace is how long a stopping agent lets the builds in hand finish
	// before it gives their asks back.
	Grace time.Duration
	// BuildTimeout bounds one build: a build still going after it (a RUN
	// that never ends, waiting on something that will not come) is stopped
	// and failed{build}, once, naming the bound, so that it does not hold
	// the machine for ever. 0: no bound.
	BuildTimeout time.Duration
	// StartedDelay is how long a build goes on before its started is
	// announced: a build that ends sooner (a cached rebuild takes tens of
	// milliseconds) announces only its outcome, which tells the
	// controller the machine, when it began (At − Duration) and how it
	// ended; on the bus that is a stored event, its delivery, its
	// acknowledgement and the controller's read of the claim fewer per
	// build. 0 or less announces started at once. Default
	// DefaultStartedDelay.
	StartedDelay time.Duration
	// Stopping, when set, is done when the process stops (its signal).
	// Run's context ending with its seat's claim lapsed (claim.ErrLapsed:
	// the bus did not answer for the seat's lease) is then no stop: no new
	// ask is taken, but the builds in hand go on to their end, each
	// announced if its ask is still its own (see Run), and the grace
	// counts only from Stopping. Unset, every end of Run's context is a
	// stop.
	Stopping context.Context
	// RetryFor bounds infrastructure retries by time: an ask whose first
	// infrastructure failure (on any machine, kept in its claim) is longer
	// ago than RetryFor is failed{infra} and settled at its next failure.
	// A failure that is the machine's (its probe fails too) spends it all
	// the same: the ask goes back at once (recording its budget in its
	// claim) and the machine stops pulling; a sick machine still takes
	// one ask per probe, without building it, and fails it "no healthy
	// machine" once its budget is gone, so that an ask settles even when
	// every machine is sick.
	RetryFor time.Duration
	// RetryDelay is the first retry's delay; it doubles per attempt up to
	// MaxRetryDelay (a minute by default).
	RetryDelay, MaxRetryDelay time.Duration
	// ClaimLease is how long an ask's claim stays alive without renewal, on
	// the server's clock (the key's TTL): a redelivered ask whose claim is
	// alive is left to its holder, so the ask of a holder that died is
	// taken by another once both the ack wait and the lease have passed.
	// The holder renews it every third of the lease. Zero (the default) is
	// three quarters of the holders' consumer's ack wait (mesh.HolderAckWait,
	// 8s: 6s): a dead machine's ask is built elsewhere within about the ack
	// wait. A holder cut off from the bus for longer loses the ask, and
	// what it says of it later is refused by the controller.
	ClaimLease time.Duration
	// SeatToken is the token of this machine's claim of its seat
	// (claim.Lease.Token): every ask claim is bound to it, so the asks of a
	// machine whose seat claim lapsed are another machine's at once. Empty
	// binds them to nothing.
	SeatToken string
	// Succeeds is the token of the seat claim this machine's holder held
	// before SeatToken's, when the seat was taken over from it: a process
	// that died holding it (killed, crashed; restarted by its supervisor)
	// or this process before its claim lapsed in an outage. The asks its
	// ask claims still hold are handed back as the agent starts
	// (handBackLeft), so that a holder takes each at once instead of after
	// the holders' ack wait. Empty: the seat was free.
	Succeeds string
	// ProbeTimeout bounds one probe of the machine (its BuildKit answers).
	ProbeTimeout time.Duration
	// ProbeEvery is how often an idle, healthy machine is probed before it
	// pulls; 0 probes only after an infrastructure failure. A sick machine
	// probes with backoff (1s doubling to 30s, and at most RetryFor/20
	// apart, 250ms at the least) until it answers. While a build goes on,
	// its BuildKit is pinged every third of it: two pings in a row that
	// get no answer within ProbeTimeout stop the build, hand its ask back
	// for another machine and turn this one sick (watchBuilder). 0 does
	// neither.
	ProbeEvery time.Duration
	// FetchWait is how long one idle pull waits before it is renewed;
	// from 10 s on the server also says every half of it that it still
	// holds the pull (PullHeartbeat). Default 5 s; a large fleet wants
	// mesh.FleetSettingsOf's (100 s at 10,000 machines of one slot), as
	// the server walks every waiting pull at each expiry and heartbeat.
	FetchWait time.Duration
	// LogFlush and LogBatchLines bound how long and how many lines build
	// output is held before it is published on log.<ask>.
	LogFlush      time.Duration
	LogBatchLines int
	// FailedLogLines is how many of the last log lines a failed carries.
	FailedLogLines int
	// Known, when set, says whether the catalogue builds a module: an ask
	// for one it does not is refused as failed{ask} and never redelivered.
	// Nil accepts every module.
	Known func(module string) bool
	// QuietHandBacks announces no handed-back event (the machine's
	// credentials may not publish it: issued from an older catalogue).
	// RunAgent sets it from the credentials.
	QuietHandBacks bool
	// State, when set, is the build agent module's state surface (the node
	// runtime's, state.FromContext): after each build it settles the agent
	// keeps the machine's record of the module there (Records). Nil keeps
	// none.
	State StateWriter
}

// DefaultBuildTimeout is Config.BuildTimeout's default: the longest job
// GitHub's hosted runners allow, long enough for a toolchain built from
// source.
const DefaultBuildTimeout = 6 * time.Hour

// DefaultStartedDelay is Config.StartedDelay's default: as long as the
// controller lets a started's store write wait for the module's next
// change (cascade.DefaultStartedStoreDelay), which covers a fully cached
// build; a build shown building that long after it began.
const DefaultStartedDelay = 250 * time.Millisecond

// DefaultConfig returns a Config with every default set.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Machine:        mesh.MachineNameOf(host),
		Slots:          1,
		Overlap:        true,
		Grace:          30 * time.Second,
		BuildTimeout:   DefaultBuildTimeout,
		StartedDelay:   DefaultStartedDelay,
		RetryFor:       5 * time.Minute,
		RetryDelay:     2 * time.Second,
		MaxRetryDelay:  time.Minute,
		ProbeTimeout:   10 * time.Second,
		ProbeEvery:     30 * time.Second,
		FetchWait:      5 * time.Second,
		LogFlush:       250 * time.Millisecond,
		LogBatchLines:  200,
		FailedLogLines: 20,
	}
}

// Validate refuses a config that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Machine == "":
		return fmt.Errorf("%w: machine is empty: set --machine", ErrConfig)
	case mesh.ValidMachineName(mesh.KindAgent, c.Machine) != nil:
		return fmt.Errorf("%w: --machine: %v", ErrConfig, mesh.ValidMachineName(mesh.KindAgent, c.Machine))
	case c.Slots < 1:
		return fmt.Errorf("%w: slots %d: want 1 or more", ErrConfig, c.Slots)
	case c.RetryFor < 0:
		return fmt.Errorf("%w: retry for %s is negative: want 0 (fail at the first infrastructure failure) or more", ErrConfig, c.RetryFor)
	case c.ClaimLease != 0 && c.ClaimLease < time.Second:
		return fmt.Errorf("%w: claim lease %s: want 0 (the ack wait) or at least 1s (longer than a bus outage should last)", ErrConfig, c.ClaimLease)
	case c.ProbeEvery < 0:
		return fmt.Errorf("%w: probe every %s is negative: want 0 (only after a failure) or more", ErrConfig, c.ProbeEvery)
	case c.ProbeTimeout <= 0:
		return fmt.Errorf("%w: probe timeout %s: want more than 0", ErrConfig, c.ProbeTimeout)
	case c.RetryDelay <= 0 || c.MaxRetryDelay < c.RetryDelay:
		return fmt.Errorf("%w: retry delay %s, max %s: want 0 < delay <= max", ErrConfig, c.RetryDelay, c.MaxRetryDelay)
	case c.FetchWait < 100*time.Millisecond:
		return fmt.Errorf("%w: fetch wait %s: want at least 100ms", ErrConfig, c.FetchWait)
	case c.Grace < 0:
		return fmt.Errorf("%w: grace %s is negative", ErrConfig, c.Grace)
	case c.BuildTimeout < 0:
		return fmt.Errorf("%w: build timeout %s is negative: want 0 (no bound) or more", ErrConfig, c.BuildTimeout)
	case c.LogBatchLines < 1 || c.LogFlush <= 0:
		return fmt.Errorf("%w: log batching needs lines >= 1 and a flush interval > 0", ErrConfig)
	}
	for _, p := range c.Platforms {
		if _, err := mesh.NormalizePlatform(p); err != nil {
			return fmt.Errorf("%w: --platforms: %v", ErrConfig, err)
		}
	}
	return nil
}

// retryDelay is the delay before attempt n+1 after attempt n failed on
// infrastructure: RetryDelay, doubled per attempt, at most MaxRetryDelay.
func (c Config) retryDelay(attempt int) time.Duration {
	return backoff.Policy{First: c.RetryDelay, Max: c.MaxRetryDelay}.Delay(attempt)
}
