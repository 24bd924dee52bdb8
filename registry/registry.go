package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the "filesystem" storage driver
	"github.com/sirupsen/logrus"
)

// Option configures the embedded registry.
type Option func(*options)

type options struct {
	log *slog.Logger
}

func makeOptions(opts []Option) options {
	o := options{log: slog.New(slog.DiscardHandler)}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithLogger sends what the registry logs to l: its configuration at
// start (info), every request it answered (debug; error for a 5xx). By
// default the registry is silent.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// New returns an OCI distribution registry that keeps everything it is
// given — blobs, manifests, tags — on disk under dir (created if missing),
// so that a registry started again on the same dir serves the same images.
// It is the CNCF distribution registry with its filesystem driver; see the
// package doc. It is to be mounted at the site root.
func New(dir string, opts ...Option) http.Handler {
	h, _ := newApp(dir, makeOptions(opts))
	return h
}

// newApp builds the distribution application over dir and returns it with
// the function that releases it.
func newApp(dir string, o options) (http.Handler, func()) {
	// A dir that cannot be created surfaces as a 500 on the first upload;
	// Serve checks it up front.
	_ = os.MkdirAll(dir, 0o755)
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	log := logrusTo(o.log)
	ctx := logContext{Context: context.Background(), log: log}
	app := handlers.NewApp(ctx, config(dir))
	return logHandler{app: app, log: log}, func() { _ = app.Shutdown() }
}

// config is the distribution configuration of the embedded registry.
func config(dir string) *configuration.Configuration {
	c := &configuration.Configuration{
		Storage: configuration.Storage{
			"filesystem": configuration.Parameters{"rootdirectory": dir},
			"delete":     configuration.Parameters{"enabled": true},
			"cache":      configuration.Parameters{"blobdescriptor": "inmemory"},
			// The client is sent to blobs on this registry itself, not to
			// a storage backend's URL.
			"redirect": configuration.Parameters{"disable": true},
			// The purger is a goroutine that would outlive a handler
			// from New, which has no Close, and it logs to logrus's
			// global logger. An upload abandoned midway leaves its
			// partial data under dir/docker/registry/v2/repositories/*/_uploads.
			"maintenance": configuration.Parameters{
				"uploadpurging": map[any]any{"enabled": false},
			},
		},
	}
	// The secret signs the state of resumable uploads handed to clients; an
	// upload in progress when the registry restarts is started again.
	c.HTTP.Secret = randomSecret()
	// A layer may name where it is fetched from (a non-distributable
	// layer's urls, which the OCI image spec allows): such a layer is not
	// stored here, so it is not looked for. By default distribution
	// refuses every such manifest.
	c.Validation.Manifests.URLs.Allow = []string{"^https?://"}
	// Locations are relative, so that the registry answers correctly under
	// whatever host name or address the client used.
	c.HTTP.RelativeURLs = true
	return c
}

func randomSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// logHandler gives every request distribution serves the registry's own
// logger, instead of logrus's global one.
type logHandler struct {
	app http.Handler
	log *logrus.Entry
}

func (h logHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.app.ServeHTTP(w, r.WithContext(logContext{Context: r.Context(), log: h.log}))
}

// logContext answers distribution's lookup of its logger with the registry's
// own. Distribution keeps the logger of a request under an unexported key
// of an internal package, and falls back to logrus's global logger — global
// state that one process's two registries (or a library user) would share —
// when a context has none. A context that answers that key is the one way to
// give it a logger without touching the global one; TestLogger fails if a
// distribution release renames the key.
type logContext struct {
	context.Context
	log *logrus.Entry
}

func (c logContext) Value(key any) any {
	if isLoggerKey(key) {
		return c.log
	}
	return c.Context.Value(key)
}

func isLoggerKey(key any) bool {
	t := reflect.TypeOf(key)
	return t != nil && t.Name() == "loggerKey" &&
		strings.HasPrefix(t.PkgPath(), "github.com/distribution/distribution/") &&
		strings.HasSuffix(t.PkgPath(), "/dcontext")
}

// logrusTo returns a logrus logger of its own (not the global one) that
// writes nothing itself and hands every entry to l.
func logrusTo(l *slog.Logger) *logrus.Entry {
	lr := logrus.New()
	lr.SetOutput(io.Discard)
	lr.SetLevel(logrus.InfoLevel)
	lr.AddHook(slogHook{l})
	return logrus.NewEntry(lr)
}

// slogHook forwards logrus entries to a slog.Logger, the fields as
// attributes.
type slogHook struct{ l *slog.Logger }

func (slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h slogHook) Fire(e *logrus.Entry) error {
	level := slog.LevelInfo
	switch {
	case e.Level <= logrus.ErrorLevel:
		level = slog.LevelError
	case e.Level == logrus.WarnLevel:
		level = slog.LevelWarn
	case e.Level >= logrus.DebugLevel:
		level = slog.LevelDebug
	}
	// distribution logs every request it answered, at error when the answer
	// is one; only the registry's own failures (5xx) are errors here, a
	// client's request refused (an unknown manifest, an unauthorized push)
	// and a request served are debug.
	if status, ok := e.Data["http.response.status"].(int); ok {
		level = slog.LevelDebug
		if status >= 500 {
			level = slog.LevelError
		}
	}
	ctx := context.Background()
	if !h.l.Enabled(ctx, level) {
		return nil
	}
	attrs := make([]slog.Attr, 0, len(e.Data))
	for k, v := range e.Data {
		attrs = append(attrs, slog.Any(k, v))
	}
	h.l.LogAttrs(ctx, level, e.Message, attrs...)
	return nil
}

// Server is an embedded registry listening on a TCP address.
type Server struct {
	ln       net.Listener
	srv      *http.Server
	shutdown func()
	done     chan struct{}

	mu    sync.Mutex
	fresh map[net.Conn]struct{} // connections that have sent no request yet

	once sync.Once
	err  error
}

// Serve starts the embedded registry on addr ("127.0.0.1:0" picks a free
// port), keeping its content under dir. It stops when ctx is done or on
// Close; started again on the same dir, it serves the same images.
func Serve(ctx context.Context, addr, dir string, opts ...Option) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("registry storage %s: %w", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("registry storage %s: %w", dir, err)
	}
	// The application first: a registry that listens answers at once.
	h, shutdown := newApp(abs, makeOptions(opts))
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		shutdown()
		return nil, fmt.Errorf("registry listening on %s: %w", addr, err)
	}
	s := &Server{
		ln: ln,
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 30 * time.Second,
		},
		shutdown: shutdown,
		done:     make(chan struct{}),
		fresh:    make(map[net.Conn]struct{}),
	}
	s.srv.ConnState = s.track
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

// track keeps the connections that have not sent a request yet.
func (s *Server) track(c net.Conn, state http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if state == http.StateNew {
		s.fresh[c] = struct{}{}
	} else {
		delete(s.fresh, c)
	}
}

// Close stops the registry, letting requests in flight finish for up to five
// seconds. Everything pushed to it stays on disk.
func (s *Server) Close() error {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut := make(chan error, 1)
		go func() { shut <- s.srv.Shutdown(ctx) }()
		// A connection a client opened but has sent nothing on (clients
		// dial ahead: go-containerregistry pings https and http at once,
		// and uploads in parallel) carries no request, but Shutdown counts
		// it as busy for its first five seconds.
		s.mu.Lock()
		for c := range s.fresh {
			c.Close()
		}
		s.mu.Unlock()
		if err := <-shut; err != nil {
			s.srv.Close()
		}
		<-s.done
		s.shutdown()
	})
	return s.err
}
