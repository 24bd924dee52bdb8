package agent

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// # A build's export beside the next one's steps
//
// A build's end is its image exported and pushed, its cache exported and
// the registry asked for what it holds (verify): on a fleet of one-slot
// machines 0.1–0.2 s a build here, and minutes for a large image on a slow
// link, in which the machine's steps would stand idle. BuildKit overlaps
// them within one bake (its max-parallelism bounds the steps run at once,
// not the exports). So does a slot (Config.Overlap): once its build's own
// steps are done (the daemon starts exporting its image), it pulls its next
// ask, which is built beside the last one's export. A slot never has more
// than two builds in hand, one of them past its steps: it pulls again only
// when the one before has settled. A build that returns without having
// exported (answered from what was pushed before) frees its slot when it
// returns built: what is left, announcing and acknowledging it, is the
// bus's (on a cluster, replicated writes). A failed one frees it when it
// settles, as before: its outcome decides whether the machine pulls again
// (sick, cooling off).

// stepsDoneKey carries a build's stepsDone through its context.
type stepsDoneKey struct{}

// WithStepsDone returns ctx carrying done, which the build worked under it
// calls (StepsDone) once its own steps are done: what is left is its
// export. As net/http/httptrace does, the hook rides in the context, so
// that a Worker that never calls it frees its slot only when it returns
// built, or else when its ask settles.
func WithStepsDone(ctx context.Context, done func()) context.Context {
	return context.WithValue(ctx, stepsDoneKey{}, done)
}

// StepsDone tells the slot that works ctx's build that its own steps are
// done (nothing when ctx carries no hook). Calls after the first do
// nothing.
func StepsDone(ctx context.Context) {
	if done, ok := ctx.Value(stepsDoneKey{}).(func()); ok {
		done()
	}
}

// handOver works msg and returns once the slot may pull again: when its
// build's steps are done (Config.Overlap) or its ask has settled, and the
// build before it (last, done when it has settled; nil for none) has
// settled too. It returns the channel closed when msg's ask has settled,
// nil when it has already.
func (a *Agent) handOver(work context.Context, msg jetstream.Msg, last <-chan struct{}) <-chan struct{} {
	if !a.cfg.Overlap {
		a.handle(work, msg)
		return nil
	}
	settled, freed := make(chan struct{}), make(chan struct{})
	free := sync.OnceFunc(func() { close(freed) })
	go func() {
		defer close(settled)
		defer free()
		a.handle(WithStepsDone(work, free), msg)
	}()
	<-freed
	if last != nil {
		<-last
	}
	select {
	case <-settled:
		return nil
	default:
		return settled
	}
}
