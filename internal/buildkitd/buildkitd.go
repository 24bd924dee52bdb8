// Package buildkitd starts a BuildKit daemon as a child process: the
// buildkitd binary built from the buildkit module pinned in go.mod, running
// as root with the OCI (runc) worker, its state in a directory of the
// caller's, listening on a unix socket. Tests start one per test through
// internal/testenv; `builds up` starts one per machine.
//
// The daemon trusts the registries it is given over plain HTTP
// ([registry."host:port"] http = true in its buildkitd.toml), which is how
// the embedded registry is reached.
package buildkitd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/buildkit/client"
	"golang.org/x/sys/unix"
)

var (
	// ErrNoBinary is wrapped when the buildkitd binary is missing.
	ErrNoBinary = errors.New("buildkitd binary not found (run make test or scripts/install-deps.sh)")
	// ErrNoRunc is wrapped when runc, which the OCI worker runs steps with,
	// is not in PATH.
	ErrNoRunc = errors.New("runc not found in PATH (apt-get install -y runc)")
	// ErrOptions is wrapped by every refusal of Options.
	ErrOptions = errors.New("invalid buildkitd options")

	// errExited is wrapped when the daemon exits before it answers.
	errExited = errors.New("buildkitd exited before it answered")
)

// maxSocketPath is the longest unix socket path Linux accepts (108 bytes
// with the terminating NUL).
const maxSocketPath = 107

// Options configure a daemon. Bin and Root are required.
type Options struct {
	// Bin is the buildkitd binary.
	Bin string
	// Root is the daemon's state directory: snapshots, cache, metadata.
	Root string
	// Socket is the unix socket path to listen on. Empty picks one in a
	// fresh directory under /tmp, since Root may be too deep for the 108
	// bytes a socket path may have.
	Socket string
	// RegistryHosts ("127.0.0.1:5000") are registries spoken to over plain
	// HTTP.
	RegistryHosts []string
	// Platforms, when set, are the platforms the OCI worker says it builds
	// (buildkitd's --oci-worker-platform), instead of the native one and
	// those QEMU's binfmt handlers emulate. A Dockerfile that runs nothing
	// (FROM scratch, COPY) builds for any platform without emulation.
	Platforms []string
	// MaxParallelism bounds the steps the worker runs at once; 0 is
	// BuildKit's default (the number of CPUs).
	MaxParallelism int
	// Snapshotter is the OCI worker's snapshotter. Empty tries "overlayfs"
	// and falls back to "native" when the daemon will not start with it.
	Snapshotter string
	// Stderr receives the daemon's log; nil discards it (its tail is kept
	// for errors either way).
	Stderr io.Writer
	// StartTimeout bounds the wait for the daemon to answer; 0 is 60s.
	StartTimeout time.Duration
	// StopTimeout is how long Stop lets the daemon shut down gracefully
	// (which waits for builds in flight) before it kills it; 0 is 10s.
	StopTimeout time.Duration
	// GC turns on BuildKit's garbage collection of its cache, with its
	// default policies (the cache kept to a share of the disk, free space
	// left for the rest); off, the cache only grows, until the disk is
	// full. A daemon that runs for long (builds up's) wants it; a test or
	// a benchmark, whose cache must not go from under it, does not.
	GC bool
}

func (o Options) validate() (Options, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrOptions, fmt.Sprintf(format, a...))
	}
	switch {
	case o.Bin == "":
		return o, bad("Bin is empty")
	case o.Root == "":
		return o, bad("Root is empty")
	case o.MaxParallelism < 0:
		return o, bad("MaxParallelism %d is negative", o.MaxParallelism)
	case len(o.Socket) > maxSocketPath:
		return o, bad("Socket %s is %d bytes, a unix socket path has at most %d", o.Socket, len(o.Socket), maxSocketPath)
	}
	for _, h := range o.RegistryHosts {
		if h == "" || strings.ContainsAny(h, "\"/\n") {
			return o, bad("registry host %q: want host:port", h)
		}
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 10 * time.Second
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return o, bad("Root %s: %v", o.Root, err)
	}
	o.Root = root
	return o, nil
}

// binary checks that Bin is a file (ErrNoBinary).
func (o Options) binary() error {
	if fi, err := os.Stat(o.Bin); err != nil || fi.IsDir() {
		return fmt.Errorf("%w: %s", ErrNoBinary, o.Bin)
	}
	return nil
}

// Buildkitd is a running daemon.
type Buildkitd struct {
	opts    Options // as started: the snapshotter that worked, the socket
	addr    string
	root    string
	stopIn  time.Duration
	cmd     *exec.Cmd
	sockDir string // removed on Stop when Start created it
	tail    *tailBuffer
	exited  chan struct{}
	waitErr error

	// mu orders signalling the daemon's process group against reaping
	// the daemon: once reaped, its pid — the group's id — may be given
	// to any new process on the machine, and a signal to the group would
	// reach whatever group that process leads.
	mu     sync.Mutex
	reaped bool

	stopOnce sync.Once
	stopErr  error
}

// Start starts buildkitd and waits until it lists its workers. A daemon that
// exits or does not answer within StartTimeout is an error carrying the tail
// of its log. ctx bounds only the start; Stop ends the daemon.
func Start(ctx context.Context, opts Options) (*Buildkitd, error) {
	o, err := opts.validate()
	if err != nil {
		return nil, err
	}
	if err := o.binary(); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return nil, ErrNoRunc
	}
	if o.Snapshotter != "" {
		return start(ctx, o)
	}
	o.Snapshotter = "overlayfs"
	b, err := start(ctx, o)
	if err == nil || !errors.Is(err, errExited) {
		return b, err
	}
	fmt.Fprintf(o.Stderr, "buildkitd: the overlayfs snapshotter failed; retrying with native: %v\n", err)
	o.Snapshotter = "native"
	b, err2 := start(ctx, o)
	if err2 != nil {
		return nil, fmt.Errorf("%w (with overlayfs: %v)", err2, err)
	}
	return b, nil
}

func start(ctx context.Context, o Options) (*Buildkitd, error) {
	if err := os.MkdirAll(o.Root, 0o700); err != nil {
		return nil, fmt.Errorf("buildkitd root: %w", err)
	}
	b := &Buildkitd{root: o.Root, stopIn: o.StopTimeout, tail: &tailBuffer{max: 16 << 10}, exited: make(chan struct{})}
	sock := o.Socket
	if sock == "" {
		dir, err := os.MkdirTemp("/tmp", "bk")
		if err != nil {
			return nil, fmt.Errorf("buildkitd socket dir: %w", err)
		}
		b.sockDir = dir
		sock = filepath.Join(dir, "buildkitd.sock")
	} else if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		return nil, fmt.Errorf("buildkitd socket dir: %w", err)
	}
	b.addr = "unix://" + sock
	b.opts = o
	b.opts.Socket = sock

	conf := filepath.Join(o.Root, "buildkitd.toml")
	otel := filepath.Join(filepath.Dir(sock), "otel-grpc.sock")
	if len(otel) > maxSocketPath {
		otel = ""
	}
	if err := os.WriteFile(conf, []byte(config(o, b.addr, otel)), 0o600); err != nil {
		b.cleanup()
		return nil, fmt.Errorf("writing %s: %w", conf, err)
	}

	cmd := exec.Command(o.Bin, "--config", conf)
	cmd.Stdout = io.MultiWriter(o.Stderr, b.tail)
	cmd.Stderr = cmd.Stdout
	cmd.Dir = o.Root
	// Its own process group, so Stop reaches runc and the steps it runs; and
	// killed with us if we die without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A step's process that outlives the daemon may hold the log pipe.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		b.cleanup()
		return nil, fmt.Errorf("starting %s: %w", o.Bin, err)
	}
	b.cmd = cmd
	go func() {
		// Until it is reaped the exited daemon is a zombie holding its
		// pid, so its group is still its own: what it left running there
		// (steps, runc) is killed, then it is reaped.
		waitExit(cmd.Process.Pid)
		b.mu.Lock()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		b.waitErr = cmd.Wait()
		b.reaped = true
		b.mu.Unlock()
		close(b.exited)
	}()

	if err := b.waitReady(ctx, o.StartTimeout); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

// config is the daemon's buildkitd.toml.
func config(o Options, addr, otel string) string {
	var c strings.Builder
	fmt.Fprintf(&c, "root = %q\n\n[grpc]\n  address = [%q]\n\n", o.Root, addr)
	if otel != "" {
		fmt.Fprintf(&c, "[otel]\n  socketPath = %q\n\n", otel)
	}
	fmt.Fprintf(&c, "[worker.oci]\n  enabled = true\n  snapshotter = %q\n  gc = %t\n", o.Snapshotter, o.GC)
	if o.MaxParallelism > 0 {
		fmt.Fprintf(&c, "  max-parallelism = %d\n", o.MaxParallelism)
	}
	if len(o.Platforms) > 0 {
		q := make([]string, len(o.Platforms))
		for i, p := range o.Platforms {
			q[i] = strconv.Quote(p)
		}
		fmt.Fprintf(&c, "  platforms = [%s]\n", strings.Join(q, ", "))
	}
	c.WriteString("\n[worker.containerd]\n  enabled = false\n")
	for _, h := range o.RegistryHosts {
		fmt.Fprintf(&c, "\n[registry.%q]\n  http = true\n", h)
	}
	return c.String()
}

func (b *Buildkitd) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		select {
		case <-b.exited:
			return fmt.Errorf("%w (%v):\n%s", errExited, b.waitErr, b.tail.String())
		default:
		}
		if last = b.ping(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("buildkitd did not answer within %s (%v):\n%s", timeout, last, b.tail.String())
		case <-b.exited:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (b *Buildkitd) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return Ping(ctx, b.addr)
}

// Ping asks the buildkitd at addr for its workers: nil when it answers with
// one at least.
func Ping(ctx context.Context, addr string) error {
	c, err := client.New(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	ws, err := c.ListWorkers(ctx)
	if err != nil {
		return err
	}
	if len(ws) == 0 {
		return errors.New("no workers")
	}
	return nil
}

// Again starts the daemon anew once it has exited (or been stopped): the
// same binary, state, snapshotter and configuration, listening at the same
// address, so that its clients need not be told of another. What the
// exited daemon left is cleared first, as Stop does (its mounts under
// Root, its socket); the new daemon owns the socket's directory if this
// one did. A daemon still running is an error.
func (b *Buildkitd) Again(ctx context.Context) (*Buildkitd, error) {
	select {
	case <-b.exited:
	default:
		return nil, fmt.Errorf("buildkitd %s is still running", b.addr)
	}
	if err := b.Stop(); err != nil {
		return nil, fmt.Errorf("clearing what buildkitd left: %w", err)
	}
	o := b.opts
	if err := o.binary(); err != nil {
		return nil, err
	}
	if err := os.Remove(o.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the socket buildkitd left: %w", err)
	}
	next, err := start(ctx, o)
	if err != nil {
		if b.sockDir != "" {
			os.RemoveAll(b.sockDir)
		}
		return nil, err
	}
	next.sockDir = b.sockDir
	return next, nil
}

// ExitErr is how the daemon's process ended (cmd.Wait's error: "signal:
// killed", "exit status 1"), nil before it has.
func (b *Buildkitd) ExitErr() error {
	select {
	case <-b.exited:
		return b.waitErr
	default:
		return nil
	}
}

// Addr is the daemon's address for client.New, "unix:///tmp/bk…/buildkitd.sock".
func (b *Buildkitd) Addr() string { return b.addr }

// Exited is closed when the daemon process has exited.
func (b *Buildkitd) Exited() <-chan struct{} { return b.exited }

// Log returns the tail of the daemon's log.
func (b *Buildkitd) Log() string { return b.tail.String() }

// Stop ends the daemon: SIGTERM to its process group, SIGKILL after
// StopTimeout; what it leaves running in its group is killed when it exits;
// then whatever it left mounted under Root is unmounted. It is safe to call
// more than once.
func (b *Buildkitd) Stop() error {
	b.stopOnce.Do(func() {
		defer b.cleanup()
		if b.cmd == nil || b.cmd.Process == nil {
			return
		}
		b.signalGroup(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(b.stopIn):
			b.signalGroup(syscall.SIGKILL)
			<-b.exited
			b.stopErr = fmt.Errorf("buildkitd did not stop within %s of SIGTERM; killed", b.stopIn)
		}
		if err := unmountUnder(b.root); err != nil && b.stopErr == nil {
			b.stopErr = err
		}
	})
	return b.stopErr
}

// signalGroup sends sig to the daemon's process group unless the daemon
// has been reaped (then its group is gone, and its id may be another's).
func (b *Buildkitd) signalGroup(sig syscall.Signal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.reaped {
		_ = syscall.Kill(-b.cmd.Process.Pid, sig)
	}
}

// waitExit blocks until process pid has exited, leaving it unreaped
// (waitid with WNOWAIT).
func waitExit(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// unmountUnder detaches every mount below dir, deepest first: a daemon
// killed mid-build leaves its steps' mounts behind.
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil // not Linux, or no /proc: nothing we could unmount
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := unescapeMount(f[4])
		if strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (b *Buildkitd) cleanup() {
	if b.sockDir != "" {
		os.RemoveAll(b.sockDir)
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// String returns the kept bytes from the first whole line on.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.buf
	if len(s) == t.max {
		if i := bytes.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return string(s)
}
