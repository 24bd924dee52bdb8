package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errw bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code := cli.Main(ctx, args, &out, &errw)
	return code, out.String(), errw.String()
}

// machines runs `builds --json machines` on the bus at url and decodes
// what it answers.
func machines(t *testing.T, url string) []cli.Machine {
	t.Helper()
	code, out, errw := run(t, "--nats", url, "--json", "machines")
	if code != 0 {
		t.Fatalf("machines: exit %d: %s", code, errw)
	}
	var ms []cli.Machine
	if err := json.Unmarshal([]byte(out), &ms); err != nil {
		t.Fatal(err)
	}
	return ms
}

func fleet(t *testing.T) string {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "examples/fleet/catalogue")
}

func TestCatalogueCheck(t *testing.T) {
	if code, out, errw := run(t, "catalogue", "check", fleet(t)); code != 0 || !strings.Contains(out, "clean") {
		t.Fatalf("check of the example fleet: exit %d\n%s\n%s", code, out, errw)
	}
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "shop.yaml"), []byte("module: shop\nemits: [shop.order.placed]\n"), 0o644)
	code, out, _ := run(t, "catalogue", "check", bad)
	if code != 1 || !strings.Contains(out, "shop.yaml") || !strings.Contains(out, "emits[0]") || !strings.Contains(out, "order.placed") {
		t.Fatalf("check of a bad catalogue: exit %d, %q", code, out)
	}
	for _, dir := range []string{t.TempDir(), filepath.Join(bad, "shop.yaml"), "/nonexistent"} {
		if code, _, errw := run(t, "catalogue", "check", dir); code != 1 || errw == "" {
			t.Errorf("check %s: exit %d, stderr %q: want 1 and a message", dir, code, errw)
		}
	}
}

func TestCatalogueShowJSON(t *testing.T) {
	code, out, errw := run(t, "--json", "catalogue", "show", fleet(t))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errw)
	}
	for _, want := range []string{`"SEAT_node-build-agent"`, `"holders-node-build-agent-linux-amd64"`, `"$JS.ACK.SEAT_node-build-agent.holders-node-build-agent-linux-amd64.\u003e"`, `"build-controller_plans"`} {
		if !strings.Contains(out, want) {
			t.Errorf("show --json lacks %s", want)
		}
	}
}

func TestExplainIsOffline(t *testing.T) {
	code, out, errw := run(t, "--nats", "nats://127.0.0.1:1", "explain", "--catalogue", fleet(t), "--repo", "https://git.example/fleet.git", "--path", "runtime/Dockerfile")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errw)
	}
	if !strings.Contains(out, "runtime") || !strings.Contains(out, "tool-35") || strings.Contains(out, "static-web") {
		t.Errorf("explain of a runtime change:\n%s", out)
	}
	if code, _, errw := run(t, "explain", "--catalogue", fleet(t), "--module", "nope"); code != 1 || !strings.Contains(errw, "nope") {
		t.Errorf("explain of an unknown module: exit %d %q", code, errw)
	}
}

func TestBadRequestsExitOneWithAClearMessage(t *testing.T) {
	s, _, _ := runFleetController(t)
	url := s.ClientURL()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"show", "abc123"}, "no plan abc123; see `builds plans`"},
		{[]string{"watch", "abc123"}, "no plan abc123"},
		{[]string{"rebuild", "nope"}, "nope"},
		{[]string{"retry", "abc123", "base"}, "no plan abc123"},
		{[]string{"cancel", "abc123"}, "no plan abc123"},
	}
	for _, c := range cases {
		code, _, errw := run(t, append([]string{"--nats", url}, c.args...)...)
		if code != 1 || !strings.Contains(errw, c.want) {
			t.Errorf("builds %v: exit %d, stderr %q: want 1 and %q", c.args, code, errw, c.want)
		}
	}
	// A push of a repository no module is built from: an empty plan, said so.
	code, out, errw := run(t, "--nats", url, "push", "--repo", "https://git.example/unknown.git", "--commit", "c1", "--watch")
	if code != 1 || !strings.Contains(out, "no module") {
		t.Errorf("push of an unknown repo: exit %d\n%s\n%s", code, out, errw)
	}
	if code, out, _ := run(t, "--nats", url, "plans"); code != 0 || !strings.Contains(out, "empty") {
		t.Errorf("plans: exit %d\n%s", code, out)
	}
}

// What an operator reads when a request is refused or repeated: each fact
// once, with the command to run next.
func TestOperatorMessages(t *testing.T) {
	s, _, _ := runFleetController(t)
	url := s.ClientURL()
	once := func(t *testing.T, errw string, words ...string) {
		t.Helper()
		for _, w := range words {
			if n := strings.Count(errw, w); n != 1 {
				t.Errorf("%q says %q %d times, want once", errw, w, n)
			}
		}
	}

	// An unknown module: the controller's words once, naming it and what
	// lists the catalogue's modules.
	code, _, errw := run(t, "--nats", url, "rebuild", "nosuchmodule")
	if code != 1 || !strings.Contains(errw, `"nosuchmodule"`) || !strings.Contains(errw, "builds catalogue show") {
		t.Errorf("rebuild nosuchmodule: exit %d, %q", code, errw)
	}
	once(t, errw, "unknown module", `"nosuchmodule"`)

	// A plan with nothing failed (no agent runs: base stays queued):
	// retrying a module of it says its state.
	code, out, errw := run(t, "--nats", url, "rebuild", "--id", "r1", "base")
	if code != 0 || !strings.Contains(out, "follow it: builds watch") {
		t.Fatalf("rebuild base: exit %d\n%s\n%s", code, out, errw)
	}
	plan := strings.TrimSuffix(strings.Fields(out)[1], ":")
	code, _, errw = run(t, "--nats", url, "retry", plan, "base")
	if code != 1 || !strings.Contains(errw, "base has not failed in plan "+plan+": it is queued") ||
		!strings.Contains(errw, "builds show "+plan) {
		t.Errorf("retry of a module that has not failed: exit %d, %q", code, errw)
	}
	once(t, errw, "has not failed", "queued")
	code, _, errw = run(t, "--nats", url, "retry", plan, "nosuch")
	if code != 1 || !strings.Contains(errw, "nosuch is not a module of plan "+plan) {
		t.Errorf("retry of a module not in the plan: exit %d, %q", code, errw)
	}

	// The same request again makes no new plan, and says so.
	code, out, errw = run(t, "--nats", url, "rebuild", "--id", "r1", "base")
	if code != 0 || !strings.Contains(out, "plan "+plan+" for --id r1 already exists") || strings.Contains(out, "modules (follow it") {
		t.Errorf("the same rebuild again: exit %d\n%s\n%s", code, out, errw)
	}
	push := []string{"--nats", url, "push", "--repo", "https://git.example/fleet.git", "--commit", "c0ffee", "--path", "tools/tool-02/Dockerfile"}
	if code, out, errw := run(t, push...); code != 0 || strings.Contains(out, "already exists") {
		t.Fatalf("push: exit %d\n%s\n%s", code, out, errw)
	}
	code, out, errw = run(t, push...)
	if code != 0 || !strings.Contains(out, "for --commit c0ffee already exists") {
		t.Errorf("the same push again: exit %d\n%s\n%s", code, out, errw)
	}
	once(t, out, "already exists")

	// Arguments: what the command takes and how to call it.
	code, _, errw = run(t, "--nats", url, "retry", "P", "a", "b")
	if code != 1 || !strings.Contains(errw, "builds retry takes 2 arguments, got 3 (P a b); usage: builds retry PLAN MODULE") {
		t.Errorf("retry with 3 arguments: exit %d, %q", code, errw)
	}
	code, _, errw = run(t, "--nats", url, "rebuild")
	if code != 1 || !strings.Contains(errw, "builds rebuild takes at least 1 argument, got none; usage: builds rebuild MODULE...") {
		t.Errorf("rebuild with no module: exit %d, %q", code, errw)
	}
}

// A catalogue of image modules alone is a catalogue: the check says which
// of the farm's own modules it added; `catalogue init` writes them, after
// which nothing is added, and a file already there is kept.
func TestCatalogueOfImageModulesAndInit(t *testing.T) {
	dir := t.TempDir()
	img := "module: app\nbuild:\n  repo: https://git.example/app.git\n"
	if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte(img), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errw := run(t, "catalogue", "check", dir)
	if code != 0 || !strings.Contains(out, "catalogue is clean but for 3 warning(s), above on stderr") {
		t.Fatalf("check of image modules alone: exit %d\n%s%s", code, out, errw)
	}
	for _, m := range []string{"build-agent", "build-controller", "git"} {
		if !strings.Contains(errw, "added the farm's own module "+m) {
			t.Errorf("the check does not say it added %s:\n%s", m, errw)
		}
	}
	mine := "# mine\n" + string(mesh.FarmManifests()["git.yaml"])
	if err := os.WriteFile(filepath.Join(dir, "git.yaml"), []byte(mine), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errw := run(t, "catalogue", "init", dir); code != 0 || !strings.Contains(out, "git.yaml: kept") {
		t.Fatalf("init: exit %d\n%s%s", code, out, errw)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "git.yaml")); string(data) != mine {
		t.Errorf("init overwrote git.yaml")
	}
	code, out, errw = run(t, "catalogue", "check", dir)
	if code != 0 || strings.Contains(errw, "added the farm's own") || !strings.HasSuffix(out, ": catalogue is clean\n") {
		t.Errorf("after init: exit %d, still adding:\n%s%s", code, out, errw)
	}
}
