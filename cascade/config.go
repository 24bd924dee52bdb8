package cascade

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/meshbuild/meshbuild/registry"
)

// Config configures a controller. A zero field means its default (see
// withDefaults, the one place defaults are set); Validate refuses what no
// default can mend.
type Config struct {
	// Registry is where images go: "HOST:PORT" or "HOST:PORT/PREFIX". A
	// module m's image is Registry/m.
	Registry string
	// RegistryClient is how the controller asks the registry for a base's
	// latest digest; nil is registry.NewClient() (credentials from the
	// docker config).
	RegistryClient *registry.Client
	// Images is how the controller checks that a built digest is an image
	// in the module's repository before it trusts it (the fence); nil is
	// the registry, through RegistryClient.
	Images ImageChecker
	// Replicas of every stream and bucket the controller raises; 0 is 1.
	Replicas int
	// PullFor is how long each pull of the controller's consumers waits
	// (seat.PullForLease of its seat claim's lease); 0 is seat's default.
	PullFor time.Duration
	// Batch is how many events are worked between two writes of the
	// state; 0 is DefaultBatch.
	Batch int
	// Module is the catalogue module the controller runs as; empty means
	// the one that holds mesh-controller.
	Module string
	// Window is the most asks of a plan queued at once (State.Window):
	// released asks beyond it are held and published best first, by
	// remaining critical path, as holders start asks. Asks are ranked by
	// each module's last build duration seen by this controller. 0
	// publishes every released ask at once (a setting, not a default: it is
	// the State's own meaning of 0). WindowIdle, DefaultConfig's, holds
	// released asks and publishes, best first, as many as holders are idle
	// (pull requests waiting on the seat's consumer): the order of a window
	// of 1 with the throughput of none; it is the only window that ranks
	// across plans (priority, fair share, caps: see Allot). 0 and N publish
	// per plan, and cannot.
	Window int
	// KeepPlans is how many settled plans the store keeps; older ones are
	// pruned, and the oldest but the newest also while the bucket holds
	// more than half its limit (Store.Prune), so that it never fills. 0 is
	// DefaultKeepPlans.
	KeepPlans int

	// ObserveEvery is how often the plans' gauges are reported and
	// overdue cancels expired; 0 is DefaultObserveEvery.
	ObserveEvery time.Duration
	// IdleLook is how soon the controller looks again for idle holders
	// while asks are held for them (WindowIdle); 0 is DefaultIdleLook.
	IdleLook time.Duration
	// PublishAckWait bounds the wait for the bus to acknowledge a flush's
	// asks; 0 is DefaultPublishAckWait.
	PublishAckWait time.Duration
	// ResolveTimeout bounds the registry lookup of one base outside a plan
	// when the plan is made; 0 is DefaultResolveTimeout.
	ResolveTimeout time.Duration
	// PruneEvery is the least time between two prunes of settled plans;
	// 0 is DefaultPruneEvery.
	PruneEvery time.Duration
	// CancelWait bounds how long a module of a cancelled plan shows
	// cancelling while its holder has not reported: after it the module is
	// cancelled anyway (the holder died or never heard). 0 is
	// DefaultCancelWait.
	CancelWait time.Duration
	// ToolTimeout bounds the controller's work on one tool request; 0 is
	// DefaultToolTimeout.
	ToolTimeout time.Duration
	// StartedStoreDelay is how long the store write of a started may wait
	// for the module's next change, so that a short build's started and
	// built are one write (startedwrite.go); 0 is
	// DefaultStartedStoreDelay, negative writes each started with its
	// batch.
	StartedStoreDelay time.Duration

	// Sources is the directory of the controller's own bare clones of the
	// modules' repositories: when a plan is made, each module's commit and
	// the git tree of its build context are resolved there, so that every
	// ask carries an input key and a module whose key was built before is
	// settled unchanged without being dispatched. Empty: no input keys, and
	// every released module is dispatched.
	Sources string
	// InsteadOf rewrites repository URLs before the controller fetches
	// them (git's url.<base>.insteadOf), as the agents' own does.
	InsteadOf map[string]string
	// StoreRetryFor bounds how long one flush retries writing plan state
	// the store refuses: then the plans it could not store are reported,
	// their writes and asks kept for the next flush, and everything else
	// goes on (one plan the store refuses does not wedge every plan). 0 is
	// DefaultStoreRetryFor.
	StoreRetryFor time.Duration

	// Shares weighs owners for fair share (see Allot): an owner's plans
	// get machines in proportion to its weight; an owner not named
	// weighs 1.
	Shares map[string]float64
	// Caps are the most machines each owner's plans may hold at once.
	Caps map[string]int
	// ShareHalfLife is how fast an owner's machine-time is forgotten: it
	// halves every ShareHalfLife. 0 is DefaultShareHalfLife.
	ShareHalfLife time.Duration
	// CancelSuperseded cancels the builds in flight that a newer plan for
	// the same repository and ref supersedes, instead of letting them
	// finish (a push may ask it too: mesh.Schedule).
	CancelSuperseded bool
}

// Defaults of a Config's zero fields.
const (
	DefaultBatch          = 512
	DefaultKeepPlans      = 500
	DefaultObserveEvery   = 5 * time.Second
	DefaultIdleLook       = 20 * time.Millisecond
	DefaultPublishAckWait = 30 * time.Second
	DefaultResolveTimeout = 10 * time.Second
	DefaultPruneEvery     = time.Minute
	DefaultCancelWait     = 2 * time.Minute
	DefaultToolTimeout    = 30 * time.Second
	DefaultStoreRetryFor  = 30 * time.Second
	DefaultShareHalfLife  = 30 * time.Minute
	// DefaultStartedStoreDelay covers a fully cached build (tens of
	// milliseconds from started to built) with room to spare; the store
	// shows a module building at most this late.
	DefaultStartedStoreDelay = 250 * time.Millisecond
)

// WindowIdle is the Config.Window that publishes as many held asks as
// holders are idle.
const WindowIdle = -1

// DefaultConfig returns a Config with every default filled in, and the
// window that waits for idle holders.
func DefaultConfig() Config {
	return Config{Window: WindowIdle}.withDefaults()
}

// withDefaults fills every zero field with its default: the one place
// defaults are set.
func (c Config) withDefaults() Config {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.KeepPlans == 0 {
		c.KeepPlans = DefaultKeepPlans
	}
	def(&c.ObserveEvery, DefaultObserveEvery)
	def(&c.IdleLook, DefaultIdleLook)
	def(&c.PublishAckWait, DefaultPublishAckWait)
	def(&c.ResolveTimeout, DefaultResolveTimeout)
	def(&c.PruneEvery, DefaultPruneEvery)
	def(&c.CancelWait, DefaultCancelWait)
	def(&c.ToolTimeout, DefaultToolTimeout)
	def(&c.StoreRetryFor, DefaultStoreRetryFor)
	def(&c.ShareHalfLife, DefaultShareHalfLife)
	def(&c.StartedStoreDelay, DefaultStartedStoreDelay)
	if c.Images == nil {
		c.Images = registryImages{c.RegistryClient}
	}
	return c
}

// ErrConfig is wrapped by every refusal of a Config.
var ErrConfig = errors.New("invalid controller config")

// Validate refuses a Config no default can mend, naming the field and what
// to set instead. Errors wrap ErrConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Registry == "":
		return fmt.Errorf("%w: no registry: set --registry HOST:PORT", ErrConfig)
	case c.Window < WindowIdle:
		return fmt.Errorf("%w: window %d: want %d (as many as holders are idle), 0 (every released ask at once) or more", ErrConfig, c.Window, WindowIdle)
	case c.Replicas < 1:
		return fmt.Errorf("%w: replicas %d: want 1 or more", ErrConfig, c.Replicas)
	case c.Batch < 1:
		return fmt.Errorf("%w: batch %d: want 1 or more", ErrConfig, c.Batch)
	case c.KeepPlans < 1:
		return fmt.Errorf("%w: keep plans %d: want 1 or more", ErrConfig, c.KeepPlans)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"observe every", c.ObserveEvery}, {"idle look", c.IdleLook}, {"publish ack wait", c.PublishAckWait},
		{"resolve timeout", c.ResolveTimeout}, {"prune every", c.PruneEvery}, {"cancel wait", c.CancelWait},
		{"tool timeout", c.ToolTimeout}, {"store retry for", c.StoreRetryFor}, {"share half-life", c.ShareHalfLife},
	} {
		if f.d < 0 {
			return fmt.Errorf("%w: %s %s is negative: want 0 (the default) or more", ErrConfig, f.name, f.d)
		}
	}
	for o, w := range c.Shares {
		if w <= 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return fmt.Errorf("%w: share of %s is %v: want a weight above 0 (1 is every owner's default)", ErrConfig, o, w)
		}
	}
	for o, n := range c.Caps {
		if n < 1 {
			return fmt.Errorf("%w: cap of %s is %d: want 1 machine or more (leave it out for none)", ErrConfig, o, n)
		}
	}
	return nil
}
