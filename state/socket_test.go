package state_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/state"
)

// helperEnv makes the test binary, re-executed, act as a module out of
// process (TestHelperModule).
const helperEnv = "STATE_TEST_HELPER_MODULE"

// TestHelperModule is not a test: it is the module process the socket test
// starts. It speaks to the runtime through state.Dial (the socket its
// environment names) and prints one line per step.
func TestHelperModule(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("run by TestOutOfProcessModuleReachesItsStateOnItsSocket")
	}
	os.Exit(helperModule())
}

func helperModule() int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	say := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	c, err := state.Dial(ctx, "")
	if err != nil {
		say("dial: %v", err)
		return 1
	}
	defer c.Close()
	if _, err := c.Put(ctx, "builds", "from-helper", []byte(`{"pid":1}`)); err != nil {
		say("put: %v", err)
		return 1
	}
	say("put ok")
	e, err := c.Get(ctx, "builds", "from-parent")
	say("get from-parent %s %v", e.Value, err)
	_, err = c.Put(ctx, "owner.builds", "x", []byte("1"))
	say("put owner.builds not-issued=%v", errors.Is(err, state.ErrNotIssued))
	_, err = c.Put(ctx, "builds", "x", []byte(`{"clientSecret":"s"}`))
	say("put secret credential=%v msg=%v", errors.Is(err, state.ErrCredential), err)
	keys, err := c.Keys(ctx, "builds")
	say("keys %s %v", strings.Join(keys, ","), err)
	w, err := c.Watch(ctx, "builds")
	if err != nil {
		say("watch: %v", err)
		return 1
	}
	var seen []string
	for ev := range w.Events() {
		seen = append(seen, string(ev.Kind)+":"+ev.Key)
		if ev.Kind == state.Current {
			if _, err := c.Put(ctx, "builds", "late", []byte(`"late"`)); err != nil {
				say("late put: %v", err)
				return 1
			}
		}
		if ev.Key == "late" {
			break
		}
	}
	w.Stop()
	for range w.Events() {
	}
	say("watch %s", strings.Join(seen, " "))
	if _, err := c.Watch(ctx, "nope"); !errors.Is(err, state.ErrNotIssued) {
		say("watch nope: %v", err)
		return 1
	}
	say("done")
	return 0
}

// TestOutOfProcessModuleReachesItsStateOnItsSocket: a separate process
// speaks the socket protocol to the runtime serving one module: its own
// bucket works, another's is refused with the sentinel across the wire, the
// credential rule holds, a watch runs in order; the socket is the module's
// alone (0600 in a 0700 directory).
func TestOutOfProcessModuleReachesItsStateOnItsSocket(t *testing.T) {
	w := newWorld(t)
	owner := w.store("n1", "owner")
	if _, err := owner.Put(w.ctx, "builds", "from-parent", []byte(`"hi"`)); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := state.SocketPath(dir, "owner")
	ln, err := state.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	served := make(chan error, 1)
	go func() { served <- state.Serve(ctx, ln, owner, nil) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %s: %v %v, want a socket of mode 0600", path, fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory: %v %v, want 0700", fi.Mode(), err)
	}

	cmd := exec.CommandContext(w.ctx, os.Args[0], "-test.run=^TestHelperModule$", "-test.v=false")
	cmd.Env = append(os.Environ(), helperEnv+"=1", state.SocketEnv+"="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the module process failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		"put ok",
		`get from-parent "hi" <nil>`,
		"put owner.builds not-issued=true",
		"put secret credential=true msg=writing x in \"builds\": credential in a value: field clientSecret names a credential",
		"keys from-helper,from-parent <nil>",
		"watch value:from-parent value:from-helper current: value:late",
		"done",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the module process did not say %q:\n%s", want, out)
		}
	}
	e, err := owner.Get(w.ctx, "builds", "from-helper")
	if err != nil || string(e.Value) != `{"pid":1}` {
		t.Fatalf("the module process's put, read in process: %q %v", e.Value, err)
	}
	w.noRefusals()
}

// TestSocketProtocolIsJSONLines speaks the documented protocol by hand.
func TestSocketProtocolIsJSONLines(t *testing.T) {
	w := newWorld(t)
	reader := w.store("n2", "reader")
	path := state.SocketPath(t.TempDir(), "reader")
	ln, err := state.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	go func() { _ = state.Serve(ctx, ln, reader, nil) }()
	c, err := state.Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Put(ctx, "owner.builds", "k", []byte("1"))
	if !errors.Is(err, state.ErrReadOnly) {
		t.Fatalf("a reader's put over the socket: %v, want ErrReadOnly", err)
	}
	// The raw exchange, as a module in any language writes it.
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintln(conn, `{"id":9,"op":"put","bucket":"owner.builds","key":"k","value":"1"}`)
	var a state.Answer
	if err := json.NewDecoder(conn).Decode(&a); err != nil {
		t.Fatal(err)
	}
	if a.ID != 9 || a.OK || a.Code != "read-only" || !strings.Contains(a.Error, "may not write") {
		t.Fatalf("answer %+v, want id 9 refused read-only", a)
	}
}
