package seat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/mesh"
)

// Consumption reads a durable pull consumer onto a channel until it is
// stopped or the consumer ends. Make one with Consume.
type Consumption struct {
	nc *nats.Conn
	js jetstream.JetStream
	// stream and consumer are the consumer's names; endGone, EndWhenGone.
	stream, consumer string
	endGone          bool
	it               jetstream.MessagesContext
	out              chan jetstream.Msg
	// abandoned is closed when Stop lets go of a drain that did not end.
	abandoned chan struct{}
	wg        sync.WaitGroup
	err       error // why the consumer ended; written before out is closed
	once      sync.Once
}

// Consume binds the durable consumer on stream and delivers its messages on
// Messages, pulling batch at a time. what names the consumption in errors
// and in log (nil: silent). A missed heartbeat is logged and the pull goes
// on; any other end of the consumer closes Messages, and Err says why.
//
// The consumer is one holder's at a time (a seat's holder: the controller's
// events, a node's declarations): what it has delivered and not seen
// acknowledged when a consumption starts is in the hands of a holder that
// is gone — killed, stopped, cut off, its seat taken over — and is taken
// back (takeBack), delivered again at once rather than after the
// consumer's ack wait.
func Consume(ctx context.Context, js jetstream.JetStream, stream, consumer string, batch int, what string, log *slog.Logger, opts ...ConsumeOption) (*Consumption, error) {
	o := consumeOptions{expiry: consumeExpiry}
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if batch < 1 {
		batch = 1
	}
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return nil, fmt.Errorf("binding the consumer of %s (%s/%s): %w", what, stream, consumer, err)
	}
	takeBack(ctx, js, cons, what, log)
	it, err := cons.Messages(jetstream.PullMaxMessages(batch), jetstream.PullExpiry(o.expiry))
	if err != nil {
		return nil, fmt.Errorf("consuming %s (%s/%s): %w", what, stream, consumer, err)
	}
	c := &Consumption{nc: js.Conn(), js: js, stream: stream, consumer: consumer, endGone: o.endGone,
		it: it, out: make(chan jetstream.Msg, batch), abandoned: make(chan struct{})}
	c.wg.Go(func() { c.pull(what, log) })
	return c, nil
}

// takeBack resets cons to its ack floor when it has messages delivered and
// not acknowledged (jetstream's ResetConsumer): a holder killed with a
// batch in hand (kill -9, a machine gone), or stopped with SIGSTOP and its
// seat taken over, left them to the consumer's ack wait — 30 s for the
// controller's events, five minutes for a node's declaration, and a node's
// consumer delivers nothing else meanwhile (one in hand at most). Every
// message past the floor is delivered again from it, those acknowledged
// out of order too: a holder works what is delivered again as it works a
// redelivery. A holder that lost its seat and wakes writes nothing and
// acknowledges nothing (claim.Lease.Held), so the two never both apply
// one. A server without the reset (before nats-server 2.14) or credentials
// that do not grant it leave them to the ack wait, and the log says so.
func takeBack(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, what string, log *slog.Logger) {
	info := cons.CachedInfo()
	if info == nil || info.NumAckPending == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, takeBackFor)
	defer cancel()
	r, err := js.ResetConsumer(ctx, info.Stream, info.Name)
	if err != nil {
		log.Warn("could not take back what the consumer's previous holder had in hand (it takes nats-server 2.14 or later, and credentials that grant the subject); it is delivered again after the consumer's ack wait",
			"of", what, "in hand", info.NumAckPending, "ack wait", info.Config.AckWait, "subject", mesh.ConsumerReset(info.Stream, info.Name), "err", err)
		return
	}
	log.Info("took back what the consumer's previous holder had in hand: delivered again from its ack floor",
		"of", what, "in hand", info.NumAckPending, "from", r.ResetSeq)
}

// takeBackFor bounds the reset's request: a server that does not know it
// does not answer.
const takeBackFor = 5 * time.Second

// ConsumeOption changes how Consume pulls.
type ConsumeOption func(*consumeOptions)

type consumeOptions struct {
	expiry  time.Duration
	endGone bool
}

// ErrConsumerGone is why a consumption made with EndWhenGone ended: the
// server no longer has the consumer or its stream.
var ErrConsumerGone = errors.New("the consumer is gone from the bus (a server started again on an empty store?)")

// EndWhenGone ends the consumption when the server deletes the consumer,
// or when its heartbeats stop and the server says, at two heartbeats in a
// row, that the consumer or its stream is not there (a server started again
// on an empty store says nothing of a deletion): Err then matches
// ErrConsumerGone. For a holder that can have its
// consumer made again (a node, by enrolling again), which otherwise pulls
// from nothing for ever.
func EndWhenGone() ConsumeOption {
	return func(o *consumeOptions) { o.endGone = true }
}

// PullingFor has each pull wait at most d (PullForLease); 0 leaves the
// default, consumeExpiry.
func PullingFor(d time.Duration) ConsumeOption {
	return func(o *consumeOptions) {
		if d > 0 {
			o.expiry = max(d, time.Second) // the least nats.go takes
		}
	}
}

// PullForLease is how long each pull of a holder whose seat claim has lease
// waits: a third of the lease (its renewal), at most consumeExpiry, at
// least a second. A holder stopped with its connection open (SIGSTOP, a
// network that drops everything) leaves its last pulls at the server until
// they expire, and what they are delivered meanwhile waits the consumer's
// ack wait (30 s for the controller's events): taken back only by a
// holder that starts after (takeBack). Its claim lapses no sooner than two
// thirds of the lease after it stopped, and the standby takes the seat
// then; a pull of a third of the lease is gone by then. With 10 s pulls and
// a lease of 3 s, a push published as the standby took over went to the
// stopped holder's pull and was planned 30 s later
// (cmd/internal/daemon TestAStandbyTakingOverFromAFrozenControllerIsDeliveredWhatFollows).
// lease 0 is claim.DefaultLease's (15 s): pulls of 5 s.
func PullForLease(lease time.Duration) time.Duration {
	if lease <= 0 {
		lease = claim.DefaultLease
	}
	return min(consumeExpiry, max(lease/3, time.Second))
}

// drainFor bounds Stop's drain.
const drainFor = 2 * time.Second

// consumeExpiry is how long each pull of a Consumption waits: the server
// is heard from every half of it (its heartbeat), and a pull lost is pulled
// again after two heartbeats missed. The pull nats.go sends again when the
// connection comes back can be lost too — on a cluster started again whole
// the consumer is not there yet when it arrives — and with nats.go's 30 s
// the controller then sat idle for some 20 s more
// (cascade TestClusterPlanSurvivesAWholeClusterRestart).
const consumeExpiry = 10 * time.Second

func (c *Consumption) pull(what string, log *slog.Logger) {
	defer close(c.out)
	missing := 0 // heartbeats in a row the server said the consumer is not there
	for {
		m, err := c.it.Next()
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			// The server missed its heartbeats (a cluster without
			// quorum, a bus away): the iterator goes on pulling.
			if c.endGone && c.gone() {
				if missing++; missing >= 2 {
					log.Warn("consumer gone from the bus", "of", what, "consumer", c.stream+"/"+c.consumer)
					c.err = fmt.Errorf("consuming %s: %w", what, ErrConsumerGone)
					c.it.Stop()
					return
				}
			} else {
				missing = 0
			}
			log.Warn("consumer missed its heartbeats; still pulling", "of", what)
			continue
		}
		missing = 0
		if c.endGone && (errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound)) {
			log.Warn("consumer gone from the bus", "of", what, "consumer", c.stream+"/"+c.consumer, "err", err)
			c.err = fmt.Errorf("consuming %s: %w: %w", what, ErrConsumerGone, err)
			return
		}
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				log.Warn("consumer stopped", "of", what, "err", err)
				c.err = fmt.Errorf("consuming %s: %w", what, err)
			}
			return
		}
		select {
		case c.out <- m:
		case <-c.abandoned:
			_ = m.Nak()
			return
		}
	}
}

// gone reports whether the server says the consumer or its stream is not
// there; a server that does not answer has not said so.
func (c *Consumption) gone() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.js.Consumer(ctx, c.stream, c.consumer)
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// Messages is the consumer's messages, closed when the consumption ends.
func (c *Consumption) Messages() <-chan jetstream.Msg { return c.out }

// Err is why the consumer ended by itself; read it only once Messages is
// closed. nil when it was stopped.
func (c *Consumption) Err() error { return c.err }

// Stop ends the consumption and waits for it: what was fetched and not
// worked goes back at once (naked), so the next holder has it without an
// ack wait. A drain needs the bus, so cut off from it, it just stops. Stop
// may be called more than once.
func (c *Consumption) Stop() {
	c.once.Do(func() {
		if c.nc != nil && c.nc.IsConnected() {
			c.it.Drain()
		} else {
			c.it.Stop()
		}
		// A drain waits for the server: on a connection that stands still
		// (the network drops everything, the server stopped with SIGSTOP;
		// its TCP connection is open, so it counts as connected) nats.go's
		// iterator never ends, and a controller that lost its seat so
		// neither stood by nor stopped until the server dropped the
		// connection, minutes later (cmd/internal/daemon
		// TestAStandbyTakingOverFromAFrozenControllerIsDeliveredWhatFollows).
		// After drainFor the consumption is let go: what it had fetched
		// goes back with the consumer's ack wait, or to the next holder's
		// take-back; the iterator ends with the connection.
		deadline := time.NewTimer(drainFor)
		defer deadline.Stop()
		for {
			select {
			case m, ok := <-c.out:
				if !ok {
					c.wg.Wait()
					return
				}
				_ = m.Nak()
			case <-deadline.C:
				close(c.abandoned)
				return
			}
		}
	})
}
