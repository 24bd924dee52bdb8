package state

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
)

// The socket protocol: JSON lines over a unix socket, one request or answer
// a line. Every request carries an id of the caller's choosing; every answer
// carries the id of the request it answers.
//
//	→ {"id":1,"op":"get","bucket":"builds","key":"app"}
//	← {"id":1,"ok":true,"value":"{\"at\":\"…\"}","revision":7}
//	→ {"id":2,"op":"put","bucket":"builds","key":"app","value":"{…}"}
//	← {"id":2,"ok":true,"revision":8}
//	→ {"id":3,"op":"delete","bucket":"builds","key":"app"}
//	← {"id":3,"ok":true}
//	→ {"id":4,"op":"keys","bucket":"builds"}
//	← {"id":4,"ok":true,"keys":["app","base"]}
//	→ {"id":5,"op":"put","bucket":"build-agent.builds","key":"x","value":"1"}
//	← {"id":5,"error":"bucket is read-only: …","code":"read-only"}
//
// A watch answers with events under its id — the current values, then
// "current", then every change — until a stop request names it; the last
// event of a stopped watch is "end", and the stop itself is answered ok:
//
//	→ {"id":6,"op":"watch","bucket":"builds"}
//	← {"id":6,"event":"value","key":"app","value":"…","revision":8}
//	← {"id":6,"event":"current"}
//	← {"id":6,"event":"deleted","key":"app","revision":9}
//	→ {"id":7,"op":"stop","watch":6}
//	← {"id":6,"event":"end"}
//	← {"id":7,"ok":true}
//
// Values are text (a JSON document, typically). An error's code names its
// sentinel: not-issued, read-only, too-large, bucket-full, credential,
// not-found, invalid-key, protocol; an error without a code is the bus's.

// Request is one request on the socket.
type Request struct {
	ID     uint64 `json:"id"`
	Op     string `json:"op"`
	Bucket string `json:"bucket,omitempty"`
	Key    string `json:"key,omitempty"`
	Value  string `json:"value,omitempty"`
	// Watch is the id of the watch a stop request ends.
	Watch uint64 `json:"watch,omitempty"`
}

// Answer is one answer or watch event on the socket.
type Answer struct {
	ID       uint64   `json:"id"`
	OK       bool     `json:"ok,omitempty"`
	Value    string   `json:"value,omitempty"`
	Revision uint64   `json:"revision,omitempty"`
	Keys     []string `json:"keys,omitempty"`
	Event    string   `json:"event,omitempty"`
	Key      string   `json:"key,omitempty"`
	Error    string   `json:"error,omitempty"`
	Code     string   `json:"code,omitempty"`
}

// Operations of the protocol, and the event ending a stopped watch.
const (
	OpGet    = "get"
	OpPut    = "put"
	OpDelete = "delete"
	OpKeys   = "keys"
	OpWatch  = "watch"
	OpStop   = "stop"
	EventEnd = "end"
)

// SocketEnv names, in an out-of-process module's environment, the socket
// its state is served on.
const SocketEnv = "MESHBUILD_STATE_SOCKET"

// SocketPath is module's socket under a node's state directory: in a
// directory of its own (state/<module>/state.sock), which only the node's
// user may enter, so it is served only to what that directory is given to.
func SocketPath(stateDir, module string) string {
	return filepath.Join(stateDir, "state", module, "state.sock")
}

// Listen makes module's socket directory (mode 0700) and listens on its
// socket (mode 0600), replacing a socket a previous run left.
func Listen(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state socket directory %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state socket directory %s: %w", dir, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the old state socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("state socket %s: %w", path, err)
	}
	return ln, nil
}

// Serve answers the protocol on every connection ln accepts, from s, until
// ctx is done or ln is closed; it closes ln and every connection before it
// returns.
func Serve(ctx context.Context, ln net.Listener, s Surface, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-ctx.Done(); ln.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accepting on the state socket: %w", err)
		}
		wg.Go(func() {
			if err := serveConn(ctx, conn, s); err != nil {
				log.Warn("state socket connection", "err", err)
			}
		})
	}
}

// serveConn answers one connection until it closes or ctx is done.
func serveConn(ctx context.Context, conn net.Conn, s Surface) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-ctx.Done(); conn.Close() }()
	var mu sync.Mutex
	enc := json.NewEncoder(conn)
	send := func(a Answer) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(a)
	}
	watches := map[uint64]*Watcher{}
	var wg sync.WaitGroup
	defer func() {
		for _, w := range watches {
			w.Stop()
		}
		wg.Wait()
	}()
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 2<<20)
	for sc.Scan() {
		var r Request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			send(fail(0, fmt.Errorf("%w: a request is one JSON object a line: %v", ErrProtocol, err)))
			continue
		}
		switch r.Op {
		case OpWatch:
			if _, dup := watches[r.ID]; dup {
				send(fail(r.ID, fmt.Errorf("%w: a watch with id %d runs already", ErrProtocol, r.ID)))
				continue
			}
			w, err := s.Watch(ctx, r.Bucket)
			if err != nil {
				send(fail(r.ID, err))
				continue
			}
			watches[r.ID] = w
			wg.Go(func() {
				for e := range w.Events() {
					send(Answer{ID: r.ID, Event: string(e.Kind), Key: e.Key, Value: string(e.Value), Revision: e.Revision})
				}
				send(Answer{ID: r.ID, Event: EventEnd})
			})
		case OpStop:
			w, ok := watches[r.Watch]
			if !ok {
				send(fail(r.ID, fmt.Errorf("%w: no watch with id %d", ErrProtocol, r.Watch)))
				continue
			}
			delete(watches, r.Watch)
			w.Stop()
			send(Answer{ID: r.ID, OK: true})
		default:
			send(answer(ctx, s, r))
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// answer works one request that is not a watch.
func answer(ctx context.Context, s Surface, r Request) Answer {
	switch r.Op {
	case OpGet:
		e, err := s.Get(ctx, r.Bucket, r.Key)
		if err != nil {
			return fail(r.ID, err)
		}
		return Answer{ID: r.ID, OK: true, Key: e.Key, Value: string(e.Value), Revision: e.Revision}
	case OpPut:
		rev, err := s.Put(ctx, r.Bucket, r.Key, []byte(r.Value))
		if err != nil {
			return fail(r.ID, err)
		}
		return Answer{ID: r.ID, OK: true, Revision: rev}
	case OpDelete:
		if err := s.Delete(ctx, r.Bucket, r.Key); err != nil {
			return fail(r.ID, err)
		}
		return Answer{ID: r.ID, OK: true}
	case OpKeys:
		keys, err := s.Keys(ctx, r.Bucket)
		if err != nil {
			return fail(r.ID, err)
		}
		return Answer{ID: r.ID, OK: true, Keys: keys}
	}
	return fail(r.ID, fmt.Errorf("%w: op %q: want get, put, delete, keys, watch or stop", ErrProtocol, r.Op))
}

func fail(id uint64, err error) Answer {
	return Answer{ID: id, Error: err.Error(), Code: codeOf(err)}
}
