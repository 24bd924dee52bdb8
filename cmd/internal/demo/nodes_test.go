package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/cmd/internal/farm/farmtest"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// TestUpRunsBuildMachinesAsNodes: `builds up`'s build machines are nodes
// that enrol and run build-agent from their declarations; the demo assigns
// the service module to the first node, which applies the digest the plan
// settled with (pulled by digest into its layout from the real registry).
func TestUpRunsBuildMachinesAsNodes(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, src := testenv.SmallFleet(t, "base", "static", "static-web")
	state := t.TempDir()
	f, logs, stop := farmtest.Up(t, farm.UpOptions{
		Catalogue: catalogue, Agents: 2, StateDir: state,
		InsteadOf: InsteadOf(state), Out: &bytes.Buffer{},
	})
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Run(ctx, f, src, &out); err != nil {
		t.Fatalf("Demo: %v\n%s", err, out.String())
	}
	t.Logf("demo output:\n%s", out.String())

	nc, _, store := operatorStore(t, ctx, f, "test")
	defer nc.Close()
	cur, err := store.Currents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := deploy.Call(ctx, nc, mesh.NodesTool, deploy.Request{})
	if err != nil {
		t.Fatal(err)
	}
	machines := f.Machines()
	if len(r.Nodes) != 2 {
		t.Fatalf("nodes %+v, want the two build machines", r.Nodes)
	}
	for i, n := range r.Nodes {
		if n.Node != machines[i] || n.Applied != n.Declared {
			t.Errorf("node %+v: want %s with its declaration applied", n, machines[i])
		}
		want := map[string]string{"build-agent": "carried"}
		if i == 0 {
			want[DemoService] = cur[DemoService].Digest
		}
		got := map[string]string{}
		for _, m := range n.Modules {
			if m.Carried {
				got[m.Module] = "carried"
			} else {
				got[m.Module] = m.Applied
			}
		}
		if len(got) != len(want) || got["build-agent"] != "carried" || got[DemoService] != want[DemoService] {
			t.Errorf("%s runs %v, want %v", n.Node, got, want)
		}
	}
	if !strings.Contains(out.String(), machines[0]+" applied "+DemoService+"@"+cur[DemoService].Digest) {
		t.Errorf("the demo does not show the node applying the new digest:\n%s", out.String())
	}
	// Every node, agent, the controller and the operator ran under their
	// own credentials, and NATS refused none of them anything.
	if v := testenv.GrepLines(logs.String(), "Violation"); v != "" {
		t.Errorf("NATS refused a component something its derived set lacks:\n%s", v)
	}
}
