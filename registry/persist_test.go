package registry_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"github.com/sirupsen/logrus"

	"github.com/meshbuild/meshbuild/internal/busybox"
	"github.com/meshbuild/meshbuild/registry"
)

func serve(t *testing.T, dir string, opts ...registry.Option) *registry.Server {
	t.Helper()
	s, err := registry.Serve(context.Background(), "127.0.0.1:0", dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ref(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRestartKeepsImages is the data-loss fix: an image, an index and the
// busybox base pushed to a registry are all served, byte for byte, by a
// registry started again on the same dir after the first one stopped.
func TestRestartKeepsImages(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "registry")
	first := serve(t, dir)

	img, err := random.Image(2048, 3)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := random.Index(1024, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref(t, first.Addr()+"/app:v1"), img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref(t, first.Addr()+"/multi:v2"), idx, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	base, err := busybox.Push(ctx, first.Addr(), "base")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	again := serve(t, dir)
	if again.Addr() == first.Addr() {
		t.Fatalf("the second registry listens on the first's address %s", again.Addr())
	}
	imgDigest, _ := img.Digest()
	idxDigest, _ := idx.Digest()

	for _, r := range []string{again.Addr() + "/app:v1", again.Addr() + "/app@" + imgDigest.String()} {
		got, err := remote.Image(ref(t, r), remote.WithContext(ctx))
		if err != nil {
			t.Fatalf("pulling %s after restart: %v", r, err)
		}
		if d, _ := got.Digest(); d != imgDigest {
			t.Errorf("%s after restart is %s, pushed %s", r, d, imgDigest)
		}
		// Every blob is there and matches its digest.
		if err := validate.Image(got); err != nil {
			t.Errorf("%s after restart: %v", r, err)
		}
	}
	for _, r := range []string{again.Addr() + "/multi:v2", again.Addr() + "/multi@" + idxDigest.String()} {
		got, err := remote.Index(ref(t, r), remote.WithContext(ctx))
		if err != nil {
			t.Fatalf("pulling %s after restart: %v", r, err)
		}
		if d, _ := got.Digest(); d != idxDigest {
			t.Errorf("%s after restart is %s, pushed %s", r, d, idxDigest)
		}
		if err := validate.Index(got); err != nil {
			t.Errorf("%s after restart: %v", r, err)
		}
	}
	for _, r := range []string{again.Addr() + "/base:latest", again.Addr() + "/base@" + base} {
		got, err := client.Resolve(ctx, r)
		if err != nil || got != base {
			t.Errorf("Resolve(%s) after restart = %s, %v; want %s", r, got, err, base)
		}
	}
	tags, err := remote.List(ref(t, again.Addr()+"/app:v1").Context(), remote.WithContext(ctx))
	if err != nil || len(tags) != 1 || tags[0] != "v1" {
		t.Errorf("tags of app after restart = %q, %v; want [v1]", tags, err)
	}
}

// TestTwoRegistries runs two registries in one process on separate dirs,
// pushed to at the same time: each serves what it was given and nothing of
// the other's, and stopping one leaves the other serving.
func TestTwoRegistries(t *testing.T) {
	ctx := context.Background()
	regs := []*registry.Server{serve(t, t.TempDir()), serve(t, t.TempDir())}
	imgs := make([]v1.Image, len(regs))
	var wg sync.WaitGroup
	errs := make([]error, len(regs))
	for i := range regs {
		img, err := random.Image(1024, 2)
		if err != nil {
			t.Fatal(err)
		}
		imgs[i] = img
		wg.Go(func() {
			errs[i] = remote.Write(ref(t, regs[i].Addr()+"/app:latest"), img, remote.WithContext(ctx))
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("push to registry %d: %v", i, err)
		}
	}
	for i, s := range regs {
		want, _ := imgs[i].Digest()
		if got, err := client.Resolve(ctx, s.Addr()+"/app:latest"); err != nil || got != want.String() {
			t.Errorf("registry %d: app:latest = %s, %v; want %s", i, got, err, want)
		}
		other, _ := imgs[1-i].Digest()
		if _, err := client.Resolve(ctx, s.Addr()+"/app@"+other.String()); !registry.IsNotFound(err) {
			t.Errorf("registry %d serves the other's image: %v", i, err)
		}
	}
	if err := regs[0].Close(); err != nil {
		t.Fatal(err)
	}
	want, _ := imgs[1].Digest()
	if got, err := client.Resolve(ctx, regs[1].Addr()+"/app:latest"); err != nil || got != want.String() {
		t.Errorf("after the first stopped, the second's app:latest = %s, %v; want %s", got, err, want)
	}
}

// records is a slog.Handler that keeps what it is given.
type records struct {
	mu  sync.Mutex
	all []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.all = append(h.all, r)
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

func (h *records) find(level slog.Level, key, value string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.all {
		found := false
		r.Attrs(func(a slog.Attr) bool {
			found = a.Key == key && fmt.Sprint(a.Value.Any()) == value
			return !found
		})
		if found && r.Level == level {
			return true
		}
	}
	return false
}

// globalHook counts what reaches logrus's global logger.
type globalHook struct {
	mu sync.Mutex
	n  int
}

func (*globalHook) Levels() []logrus.Level { return logrus.AllLevels }
func (h *globalHook) Fire(*logrus.Entry) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	return nil
}

// TestLogger checks that distribution logs to the logger given, and to
// nothing else: not logrus's global logger, which distribution falls back
// to if the registry's logger is not found under its key.
func TestLogger(t *testing.T) {
	ctx := context.Background()
	global := &globalHook{}
	old := logrus.StandardLogger().ReplaceHooks(logrus.LevelHooks{})
	logrus.StandardLogger().AddHook(global)
	t.Cleanup(func() { logrus.StandardLogger().ReplaceHooks(old) })

	rec := &records{}
	logged := serve(t, t.TempDir(), registry.WithLogger(slog.New(rec)))
	silent := serve(t, t.TempDir())
	for _, s := range []*registry.Server{logged, silent} {
		if _, err := client.Resolve(ctx, s.Addr()+"/nothing:latest"); !registry.IsNotFound(err) {
			t.Fatalf("Resolve of a missing image: %v", err)
		}
		if _, err := busybox.Push(ctx, s.Addr(), "busybox"); err != nil {
			t.Fatal(err)
		}
	}
	// distribution logs a request that ended in an error with its code; a
	// refusal (4xx) is not the registry's error, so it is logged at debug.
	if !rec.find(slog.LevelDebug, "err.code", "manifest unknown") {
		rec.mu.Lock()
		for _, r := range rec.all {
			t.Logf("record: %s %s", r.Level, r.Message)
			r.Attrs(func(a slog.Attr) bool { t.Logf("  %s=%v", a.Key, a.Value); return true })
		}
		rec.mu.Unlock()
		t.Error("the registry given a logger logged no error for a missing manifest")
	}
	global.mu.Lock()
	defer global.mu.Unlock()
	if global.n != 0 {
		t.Errorf("%d entries reached logrus's global logger, want none", global.n)
	}
}
