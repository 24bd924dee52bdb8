package state

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
)

// Client is the state surface of a module out of process: the node
// runtime's socket for it (SocketEnv names it), spoken in the protocol
// Serve answers. It is safe for concurrent use.
type Client struct {
	conn net.Conn

	wmu sync.Mutex
	enc *json.Encoder

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan Answer
	watches map[uint64]chan Answer
	err     error
	closed  chan struct{}
}

var _ Surface = (*Client)(nil)

// Dial connects to a state socket; path "" is the one SocketEnv names.
func Dial(ctx context.Context, path string) (*Client, error) {
	if path == "" {
		path = os.Getenv(SocketEnv)
	}
	if path == "" {
		return nil, fmt.Errorf("no state socket: %s is not set (the node runtime sets it for the modules it starts)", SocketEnv)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connecting to the state socket %s: %w", path, err)
	}
	c := &Client{conn: conn, enc: json.NewEncoder(conn), pending: map[uint64]chan Answer{},
		watches: map[uint64]chan Answer{}, closed: make(chan struct{})}
	go c.read()
	return c, nil
}

// Close ends the connection; watches end with it.
func (c *Client) Close() error { return c.conn.Close() }

func (c *Client) read() {
	sc := bufio.NewScanner(c.conn)
	sc.Buffer(make([]byte, 64<<10), 2<<20)
	for sc.Scan() {
		var a Answer
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			continue
		}
		c.mu.Lock()
		if ch, ok := c.watches[a.ID]; ok && a.Event != "" {
			c.mu.Unlock()
			ch <- a
			continue
		}
		ch, ok := c.pending[a.ID]
		delete(c.pending, a.ID)
		c.mu.Unlock()
		if ok {
			ch <- a
		}
	}
	c.mu.Lock()
	c.err = sc.Err()
	if c.err == nil {
		c.err = errors.New("the state socket closed")
	}
	for _, ch := range c.watches {
		close(ch)
	}
	c.watches = map[uint64]chan Answer{}
	c.mu.Unlock()
	close(c.closed)
}

// call sends r and waits for its answer.
func (c *Client) call(ctx context.Context, r Request) (Answer, error) {
	ch := make(chan Answer, 1)
	c.mu.Lock()
	c.next++
	r.ID = c.next
	c.pending[r.ID] = ch
	c.mu.Unlock()
	if err := c.send(r); err != nil {
		return Answer{}, err
	}
	select {
	case a := <-ch:
		if a.Error != "" {
			return a, fromWire(a.Code, a.Error)
		}
		return a, nil
	case <-c.closed:
		return Answer{}, fmt.Errorf("state socket: %w", c.err)
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, r.ID)
		c.mu.Unlock()
		return Answer{}, ctx.Err()
	}
}

func (c *Client) send(r Request) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.enc.Encode(r); err != nil {
		return fmt.Errorf("writing to the state socket: %w", err)
	}
	return nil
}

// Get returns the current value of key in bucket.
func (c *Client) Get(ctx context.Context, bucket, key string) (Entry, error) {
	a, err := c.call(ctx, Request{Op: OpGet, Bucket: bucket, Key: key})
	if err != nil {
		return Entry{}, err
	}
	return Entry{Bucket: bucket, Key: a.Key, Value: []byte(a.Value), Revision: a.Revision}, nil
}

// Put writes value (text) under key in bucket.
func (c *Client) Put(ctx context.Context, bucket, key string, value []byte) (uint64, error) {
	a, err := c.call(ctx, Request{Op: OpPut, Bucket: bucket, Key: key, Value: string(value)})
	return a.Revision, err
}

// Delete deletes key from bucket.
func (c *Client) Delete(ctx context.Context, bucket, key string) error {
	_, err := c.call(ctx, Request{Op: OpDelete, Bucket: bucket, Key: key})
	return err
}

// Keys returns every key with a value in bucket.
func (c *Client) Keys(ctx context.Context, bucket string) ([]string, error) {
	a, err := c.call(ctx, Request{Op: OpKeys, Bucket: bucket})
	if err != nil {
		return nil, err
	}
	if a.Keys == nil {
		return []string{}, nil
	}
	return a.Keys, nil
}

// Watch watches bucket through the runtime: the same order as Store.Watch.
// A refusal (a bucket not issued) is returned here, not as an event.
func (c *Client) Watch(ctx context.Context, bucket string) (*Watcher, error) {
	ch := make(chan Answer, 64)
	c.mu.Lock()
	c.next++
	id := c.next
	c.watches[id] = ch
	c.pending[id] = ch // a refusal comes as an answer without an event
	c.mu.Unlock()
	if err := c.send(Request{ID: id, Op: OpWatch, Bucket: bucket}); err != nil {
		return nil, err
	}
	var first Answer
	select {
	case a, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("state socket: %w", c.err)
		}
		first = a
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if first.Event == "" {
		c.mu.Lock()
		delete(c.watches, id)
		c.mu.Unlock()
		return nil, fromWire(first.Code, first.Error)
	}
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
	stop := func() {
		_, _ = c.call(context.Background(), Request{Op: OpStop, Watch: id})
	}
	return newWatcher(ctx, stop, func(send func(Event) bool) {
		ended := false
		for a := first; ; {
			if a.Event == EventEnd {
				ended = true
				break
			}
			if !send(Event{Kind: Kind(a.Event), Key: a.Key, Value: []byte(a.Value), Revision: a.Revision}) {
				break
			}
			var ok bool
			if a, ok = <-ch; !ok {
				ended = true
				break
			}
		}
		// Stopped: take what the runtime still sends until it says the
		// watch ended, so the reader never blocks on this watch.
		for !ended {
			a, ok := <-ch
			ended = !ok || a.Event == EventEnd
		}
		c.mu.Lock()
		delete(c.watches, id)
		c.mu.Unlock()
	}), nil
}
