package testenv

import (
	"net"
	"sync"
	"testing"
)

// Freezer is a TCP proxy to a server that the test can freeze: while
// frozen, nothing passes either way, yet every connection stays open — as
// a server stopped with SIGSTOP, or a network that drops every packet,
// looks to its clients (none of them is disconnected, none reconnects).
type Freezer struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	thawed *sync.Cond
	frozen bool
	conns  []net.Conn
}

// Freeze starts a Freezer to target (host:port), closed with the test.
func Freeze(t testing.TB, target string) *Freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &Freezer{ln: ln, target: target}
	f.thawed = sync.NewCond(&f.mu)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

// Addr is the proxy's address: clients dial it instead of the target.
func (f *Freezer) Addr() string { return f.ln.Addr().String() }

// Freeze stops everything passing, either way, until Thaw.
func (f *Freezer) Freeze() {
	f.mu.Lock()
	f.frozen = true
	f.mu.Unlock()
}

// Thaw lets everything held pass, and what follows.
func (f *Freezer) Thaw() {
	f.mu.Lock()
	f.frozen = false
	f.thawed.Broadcast()
	f.mu.Unlock()
}

func (f *Freezer) close() {
	f.ln.Close()
	f.mu.Lock()
	f.frozen = false
	f.thawed.Broadcast()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
}

func (f *Freezer) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, s)
		f.mu.Unlock()
		go f.pipe(s, c)
		go f.pipe(c, s)
	}
}

// pipe copies from src to dst, holding each read while frozen.
func (f *Freezer) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			for f.frozen {
				f.thawed.Wait()
			}
			f.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
