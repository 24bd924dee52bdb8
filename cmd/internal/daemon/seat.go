package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/backoff"
	"github.com/meshbuild/meshbuild/mesh"
)

// seat is one process's hold of its seat (the agent's machine seat, the
// controller's mesh-controller): a bus outage of any length does not end
// it, and a claim the process left behind itself — before an outage, or
// in a life before a crash — is recognised as its own and taken at once,
// instead of waiting out its lease.
type seat struct {
	js     jetstream.JetStream
	seat   string
	scope  claim.Scope
	holder string // claim.Process of this process
	opts   []claim.Option
	log    *slog.Logger
	// refuse: the first claim is refused, not waited for, when another
	// live holder has the seat (a second agent on a machine is a mistake
	// to say at once; a second controller is a standby).
	refuse bool
}

// errStartOver is returned by a holder's work when the bus lost what it
// works on (mesh.WireGone): hold takes the seat again and runs it anew.
var errStartOver = errors.New("the bus lost the farm's streams: starting over")

// hold runs fn as the seat's holder, with a context cancelled the moment
// the claim is lost, and the claim it succeeds: the one this holder took
// the seat over from (its own, left behind by a process that died or lost
// by this one in an outage, or one it stood by for), nil when the seat was
// free. After a loss (the bus did not answer for a lease) it says so,
// stands by while the bus is away, takes the seat back — its own stale
// claim at once — and runs fn again. It returns when ctx is done
// (nil), when fn returns while the claim is held (fn's error), or when the
// first claim is refused.
func (s seat) hold(ctx context.Context, fn func(ctx context.Context, l *claim.Lease, succeeds *claim.Record) error) error {
	var lost *claim.Record
	for first := true; ; first = false {
		l, succeeds, err := s.take(ctx, lost, first && s.refuse)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		hctx, cancel := l.Context(ctx)
		err = fn(hctx, l, succeeds)
		cancel()
		lostErr := l.Err()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if rerr := l.Release(rctx); rerr != nil {
			s.log.Warn("releasing the seat", "seat", s.seat, "err", rerr)
		}
		rcancel()
		if ctx.Err() != nil {
			return nil // stopping: what fn said on its way out is not a failure
		}
		if errors.Is(err, errStartOver) {
			rec := l.Record() // its own, if the claim outlived the rest
			lost = &rec
			continue
		}
		if !errors.Is(lostErr, claim.ErrLost) {
			return err
		}
		rec := l.Record()
		lost = &rec
		s.log.Error("lost the seat's claim (the bus did not answer within the lease): stopped working; standing by to take it back",
			"seat", s.seat, "scope", s.scope.String(), "err", lostErr, "work_err", err)
	}
}

// take claims the seat, and says which claim it succeeds (hold). A claim
// held there that is this holder's own and stale (ownStale) is removed —
// only if it is still that claim — and the seat claimed at once, said in
// the log. While the bus does not answer it
// waits, saying so. Another live holder's claim is refused when refuse,
// else waited for (claim.Standby).
func (s seat) take(ctx context.Context, lost *claim.Record, refuse bool) (*claim.Lease, *claim.Record, error) {
	retry := backoff.Policy{First: 250 * time.Millisecond, Max: 5 * time.Second}
	succeeds := lost
	for attempt := 1; ; attempt++ {
		l, err := claim.Claim(ctx, s.js, s.seat, s.scope, s.holder, append(s.opts, claim.WithLogger(s.log))...)
		if err == nil {
			if lost != nil {
				s.log.Info("took the seat back", "seat", s.seat, "scope", s.scope.String())
			}
			return l, succeeds, nil
		}
		var ce *claim.ClaimedError
		switch {
		case ctx.Err() != nil:
			return nil, nil, ctx.Err()
		case errors.As(err, &ce):
			prev := ce.Record
			why, stale := ownStale(prev, s.holder, lost)
			if !stale {
				if refuse {
					return nil, nil, err
				}
				l, err := claim.Standby(ctx, s.js, s.seat, s.scope, s.holder, append(s.opts, claim.WithLogger(s.log))...)
				return l, &prev, err
			}
			s.log.Warn("the seat's claim is this holder's own, left behind: taking it now instead of waiting out its lease",
				"seat", s.seat, "scope", s.scope.String(), "claim", prev.Holder, "since", prev.Since.Format(time.RFC3339), "why", why)
			if err := s.clear(ctx, prev); err != nil {
				s.log.Warn("removing our own stale claim failed; it lapses within its lease", "seat", s.seat, "lease", prev.Lease, "err", err)
				l, err := claim.Standby(ctx, s.js, s.seat, s.scope, s.holder, append(s.opts, claim.WithLogger(s.log))...)
				return l, &prev, err
			}
			succeeds = &prev
			continue
		case lost == nil && refuse:
			return nil, nil, err // the first claim of a process: say why at once
		}
		s.log.Warn("the bus does not answer: standing by to take the seat back", "seat", s.seat, "scope", s.scope.String(), "err", err, "attempt", attempt)
		if err := backoff.Wait(ctx, retry.Delay(attempt)); err != nil {
			return nil, nil, err
		}
	}
}

// clear deletes the claim rec from the claims bucket, only while the key
// still holds that claim (its token, at the revision read): a claim taken
// by anyone meanwhile is left alone.
func (s seat) clear(ctx context.Context, rec claim.Record) error {
	kv, err := s.js.KeyValue(ctx, mesh.ClaimsBucket())
	if err != nil {
		return err
	}
	key := mesh.ClaimKey(s.seat, s.scope.Node())
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil // lapsed meanwhile
	}
	if err != nil {
		return err
	}
	var cur claim.Record
	if err := json.Unmarshal(e.Value(), &cur); err != nil || cur.Token != rec.Token {
		return fmt.Errorf("the claim changed while it was read (now %q)", cur.Holder)
	}
	return kv.Delete(ctx, key, jetstream.LastRevision(e.Revision()))
}

// holderRE reads claim.Process's "NAME on HOST pid PID".
var holderRE = regexp.MustCompile(`^(.+) on (.+) pid ([0-9]+)$`)

func parseHolder(h string) (name, host string, pid int, ok bool) {
	m := holderRE.FindStringSubmatch(h)
	if m == nil {
		return "", "", 0, false
	}
	pid, err := strconv.Atoi(m[3])
	return m[1], m[2], pid, err == nil
}

// ownStale reports whether rec, a claim found on the seat, is holder's own
// and nobody's now: the claim of the lease this process lost (lost, by its
// token), or one of a process of holder's name on this host whose pid is no
// longer running (this process before a crash or kill). A live pid, another
// host or another name is another holder's; so is a host named localhost
// (or unknown), which many machines may share.
func ownStale(rec claim.Record, holder string, lost *claim.Record) (why string, ok bool) {
	if lost != nil && rec.Token == lost.Token {
		return "the claim this process held before the bus went away", true
	}
	name, host, pid, ok1 := parseHolder(rec.Holder)
	myName, myHost, myPid, ok2 := parseHolder(holder)
	if !ok1 || !ok2 || name != myName || host != myHost || pid == myPid || pid <= 0 || running(pid) {
		return "", false
	}
	if host == "localhost" || host == "unknown host" {
		return "", false // a name many machines share: the pid may be another's
	}
	return fmt.Sprintf("pid %d on this host (%s) is no longer running", pid, host), true
}

// running reports whether a process with pid runs on this host. A process
// killed and not yet reaped (a zombie, as one killed with -9 stays until
// its parent or init waits for it: seen for seconds where init is slow to,
// forever in a container without one) runs no more.
func running(pid int) bool {
	err := syscall.Kill(pid, 0)
	if err != nil {
		return errors.Is(err, syscall.EPERM)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: as kill says
	}
	// pid (comm) state …: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return true
	}
	state := data[i+2]
	return state != 'Z' && state != 'X'
}
