package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// TestNodesAssignUnassign: the operator's view of the fleet and its
// assignments, against build-controller (which runs the fleet) and a node
// that enrols on a real server.
func TestNodesAssignUnassign(t *testing.T) {
	s, ctx, _ := runFleetController(t)
	url := s.ClientURL()
	testenv.WaitFor(t, 10*time.Second, "builds nodes to answer", func() bool {
		code, out, _ := run(t, "--nats", url, "nodes")
		return code == 0 && strings.Contains(out, "no node has enrolled")
	})

	nc, err := nats.Connect(url, nats.CustomInboxPrefix(mesh.InboxPrefix("n1")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cfg := deploy.DefaultNodeConfig()
	cfg.Name, cfg.StateDir, cfg.Platforms = "n1", t.TempDir(), []string{"linux/amd64"}
	n, err := deploy.NewNode(cfg, js, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = n.Run(ctx) }()
	testenv.WaitFor(t, 10*time.Second, "n1 to enrol", func() bool {
		_, out, _ := run(t, "--nats", url, "nodes")
		return strings.Contains(out, "n1")
	})

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"assign", "nope", "n1"}, "unknown module \"nope\""},
		{[]string{"assign", "base", "n9"}, "mesh-node --name n9"},
		{[]string{"unassign", "base", "n1"}, "not assigned"},
	} {
		code, _, errw := run(t, append([]string{"--nats", url}, c.args...)...)
		if code != 1 || !strings.Contains(errw, c.want) {
			t.Errorf("builds %v: exit %d, stderr %q: want 1 and %q", c.args, code, errw, c.want)
		}
	}
	code, out, errw := run(t, "--nats", url, "assign", "base", "n1")
	if code != 0 || !strings.Contains(out, "base is assigned to n1") || !strings.Contains(out, "declared n1 revision 1") {
		t.Fatalf("assign: exit %d\n%s\n%s", code, out, errw)
	}
	testenv.WaitFor(t, 10*time.Second, "n1 to apply revision 1", func() bool { return n.Applied() == 1 })
	var views []deploy.NodeView
	testenv.WaitFor(t, 10*time.Second, "builds nodes --json to show revision 1 applied", func() bool {
		_, out, _ := run(t, "--nats", url, "--json", "nodes")
		views = nil
		return json.Unmarshal([]byte(out), &views) == nil && len(views) == 1 && views[0].Applied == 1
	})
	if v := views[0]; v.Node != "n1" || v.Declared != 1 || !v.Online || len(v.Modules) != 1 || v.Modules[0].Module != "base" {
		t.Fatalf("builds nodes --json: %+v", v)
	}
	if _, out, _ := run(t, "--nats", url, "nodes"); !strings.Contains(out, "base (not built yet)") {
		t.Errorf("builds nodes:\n%s", out)
	}
	if code, out, errw := run(t, "--nats", url, "assign", "build-agent", "n1"); code != 0 {
		t.Fatalf("assign build-agent: exit %d\n%s\n%s", code, out, errw)
	}
	var seats []deploy.SeatView
	if code, out, errw := run(t, "--nats", url, "--json", "seats"); code != 0 || json.Unmarshal([]byte(out), &seats) != nil {
		t.Fatalf("seats --json: exit %d\n%s\n%s", code, out, errw)
	}
	bySeat := map[string]deploy.SeatView{}
	for _, s := range seats {
		bySeat[s.Seat] = s
	}
	if s := bySeat[mesh.BuildSeat]; s.Scope != mesh.ScopeNode || len(s.Holders) != 1 || s.Holders[0].Node != "n1" || s.Holders[0].Module != "build-agent" {
		t.Errorf("node-build-agent: %+v", s)
	}
	if s := bySeat[mesh.ControllerSeat]; s.Scope != mesh.ScopeMesh || len(s.Holders) != 0 || !s.Accepts {
		t.Errorf("mesh-controller: %+v", s)
	}
	if _, out, _ := run(t, "--nats", url, "seats"); !strings.Contains(out, "node-build-agent") || !strings.Contains(out, "n1 (online") {
		t.Errorf("builds seats:\n%s", out)
	}
	if code, _, errw := run(t, "--nats", url, "unassign", "build-agent", "n1"); code != 0 {
		t.Fatal(errw)
	}
	if code, out, errw := run(t, "--nats", url, "unassign", "base", "n1"); code != 0 || !strings.Contains(out, "base is assigned to no node") || !strings.Contains(out, "declared n1 revision 4") {
		t.Fatalf("unassign: exit %d\n%s\n%s", code, out, errw)
	}
	testenv.WaitFor(t, 10*time.Second, "n1 to apply revision 4", func() bool { return n.Applied() == 4 })
}
