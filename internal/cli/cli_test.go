package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/internal/cli"
	"github.com/meshbuild/meshbuild/internal/farm"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errw bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code := cli.Main(ctx, args, &out, &errw)
	return code, out.String(), errw.String()
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
	for _, want := range []string{`"SEAT_node-build-agent"`, `"holders-node-build-agent"`, `"$JS.ACK.SEAT_node-build-agent.holders-node-build-agent.\u003e"`, `"build-controller_plans"`} {
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
	s := natstest.Server(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		errs <- farm.RunController(ctx, farm.ControllerOptions{NATS: s.ClientURL(), Catalogue: fleet(t),
			Controller: cascade.Config{Registry: "127.0.0.1:1"}, Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-errs:
		t.Fatal(err)
	}
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
