package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
)

// Option configures the embedded registry.
type Option func(*options)

type options struct {
	log *log.Logger
}

func makeOptions(opts []Option) options {
	o := options{log: log.New(io.Discard, "", 0)}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithLogger logs every request the registry serves to l. By default the
// registry is silent.
func WithLogger(l *log.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// New returns an OCI distribution registry that keeps blobs on disk under
// dir (created if missing) and manifests in memory; see the package doc. It
// is to be mounted at the site root.
func New(dir string, opts ...Option) http.Handler {
	o := makeOptions(opts)
	// A dir that cannot be created surfaces as a 500 on the first upload;
	// Serve checks it up front.
	_ = os.MkdirAll(dir, 0o755)
	return ggcr.New(
		ggcr.WithBlobHandler(ggcr.NewDiskBlobHandler(dir)),
		ggcr.Logger(o.log),
	)
}

// Server is an embedded registry listening on a TCP address.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{}

	once sync.Once
	err  error
}

// Serve starts the embedded registry on addr ("127.0.0.1:0" picks a free
// port) with its blobs under dir. It stops when ctx is done or on Close.
func Serve(ctx context.Context, addr, dir string, opts ...Option) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("registry storage %s: %w", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("registry storage %s: %w", dir, err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("registry listening on %s: %w", addr, err)
	}
	s := &Server{
		ln: ln,
		srv: &http.Server{
			Handler:           New(abs, opts...),
			ReadHeaderTimeout: 30 * time.Second,
		},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.done:
		}
	}()
	return s, nil
}

// Addr is the host:port the registry listens on, the registry part of its
// image references.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the registry, letting requests in flight finish for up to five
// seconds.
func (s *Server) Close() error {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.srv.Close()
		}
		<-s.done
	})
	return s.err
}
