package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/nats-io/nats.go/jetstream"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// catalogueWith copies the example fleet's catalogue into a new directory
// and adds files to it.
func catalogueWith(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	src := fleet(t)
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestStateCommandsUnderOperatorPermissions: `builds state` reads and writes
// a module's bucket as the operator on a server that enforces the
// operator's derived set; the runtime's rules hold (a credential-named
// field is refused, naming it); `catalogue show --live` reports a bucket
// whose module left the catalogue, and the bucket stays.
func TestStateCommandsUnderOperatorPermissions(t *testing.T) {
	notes := "module: notes\nstate:\n  - {name: settings}\n"
	gone := "module: gone\nstate:\n  - {name: things}\n"
	full := catalogueWith(t, map[string]string{"notes.yaml": notes, "gone.yaml": gone})
	later := catalogueWith(t, map[string]string{"notes.yaml": notes})
	cat, problems, err := mesh.Load(full)
	if err != nil || mesh.HasErrors(problems) {
		t.Fatal(err, problems)
	}
	op := cat.OperatorPermissions("operator")
	s := natstest.Server(t, &server.Options{Users: []*server.User{
		{Username: "admin", Password: "pw"},
		{Username: "operator", Password: "pw", Permissions: op.ServerPermissions()},
	}})
	_, ajs := natstest.Connect(t, s, nats.UserInfo("admin", "pw"))
	if _, err := mesh.Raise(context.Background(), ajs, cat, 1); err != nil {
		t.Fatal(err)
	}
	url := "nats://operator:pw@" + strings.TrimPrefix(s.ClientURL(), "nats://")
	builds := func(want int, args ...string) (string, string) {
		t.Helper()
		code, out, errw := run(t, append([]string{"--nats", url}, args...)...)
		if code != want {
			t.Fatalf("builds %s: exit %d, want %d\n%s\n%s", strings.Join(args, " "), code, want, out, errw)
		}
		return out, errw
	}

	if out, _ := builds(0, "state", "put", "notes.settings", "app", `{"pinned":true}`); !strings.Contains(out, "notes.settings app: revision 1") {
		t.Errorf("put:\n%s", out)
	}
	out, _ := builds(0, "--json", "state", "get", "notes.settings", "app")
	var e struct {
		Key, Value string
		Revision   uint64
	}
	if err := json.Unmarshal([]byte(out), &e); err != nil || e.Key != "app" || e.Value != `{"pinned":true}` || e.Revision != 1 {
		t.Errorf("get --json: %+v %v\n%s", e, err, out)
	}
	if out, _ := builds(0, "state", "keys", "notes.settings"); strings.TrimSpace(out) != "app" {
		t.Errorf("keys:\n%s", out)
	}
	if _, errw := builds(1, "state", "put", "notes.settings", "db", `{"conn":{"Password":"x"}}`); !strings.Contains(errw, "field conn.Password names a credential") {
		t.Errorf("a credential-named field:\n%s", errw)
	}
	if _, errw := builds(1, "state", "get", "notes.settings", "nope"); !strings.Contains(errw, "builds state keys notes.settings") {
		t.Errorf("a missing key:\n%s", errw)
	}
	if _, errw := builds(1, "state", "keys", "notes"); !strings.Contains(errw, "MODULE.BUCKET") {
		t.Errorf("a bucket named without its module:\n%s", errw)
	}
	out, _ = builds(0, "--json", "state", "watch", "notes.settings", "--current")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"kind":"value"`) || !strings.Contains(lines[1], `"kind":"current"`) {
		t.Errorf("watch --current --json:\n%s", out)
	}

	// The controller's own state is read-only to the operator (issue 19):
	// a raw write to the plans is refused by the server and lands nowhere.
	if _, ok := cat.Module("build-controller"); ok {
		if _, errw := builds(1, "state", "put", "build-controller.plans", "plan.forged", `{"id":"forged"}`); !strings.Contains(errw, "read-only to the operator") {
			t.Errorf("a raw write to the plans:\n%s", errw)
		}
		kv, err := ajs.KeyValue(context.Background(), mesh.KVBucket("build-controller", "plans"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Get(context.Background(), "plan.forged"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("the operator's raw write to the plans: %v, want no such key", err)
		}
	}

	// gone leaves the catalogue: its bucket is reported and kept.
	if _, err := ajs.KeyValue(context.Background(), "gone_things"); err != nil {
		t.Fatal(err)
	}
	out, _ = builds(0, "catalogue", "show", later, "--live")
	if !strings.Contains(out, "declaration gone") || !strings.Contains(out, "bucket gone_things") || strings.Contains(out, "bucket notes_settings\n") {
		t.Errorf("catalogue show --live:\n%s", out)
	}
	out, _ = builds(0, "--json", "catalogue", "show", later, "--live")
	var view struct{ Orphans []string }
	if err := json.Unmarshal([]byte(out), &view); err != nil || len(view.Orphans) != 1 || view.Orphans[0] != "bucket gone_things" {
		t.Errorf("catalogue show --live --json orphans: %v %v", view.Orphans, err)
	}
	if _, err := ajs.KeyValue(context.Background(), "gone_things"); err != nil {
		t.Fatalf("the orphaned bucket was removed: %v", err)
	}
}
