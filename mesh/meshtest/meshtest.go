// Package meshtest holds the catalogues tests run against: the example
// fleet's own modules, read from examples/fleet/catalogue, plus modules
// of a test's own graph. It is for tests only.
package meshtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// FleetRepo is the repository the test catalogues' modules are built from.
const FleetRepo = "https://git.example/fleet.git"

// MeshModules are the example fleet's own modules every farm needs: the
// build agent (holding node-build-agent), the controller (holding
// mesh-controller) and git (holding mesh-git).
var MeshModules = []string{"build-agent", "build-controller", "git"}

// Catalogue returns a catalogue of the example fleet's own modules, read
// from examples/fleet/catalogue so that tests run the manifests operators
// see, plus one built module per entry of graph (module → its build.on),
// built from FleetRepo at path = module.
func Catalogue(tb testing.TB, graph map[string][]string) *mesh.Catalogue {
	tb.Helper()
	ms := MeshManifests(tb)
	for m, on := range graph {
		ms = append(ms, &mesh.Manifest{Module: m, Build: &mesh.Build{Repo: FleetRepo, Path: m, On: on}})
	}
	c := mesh.NewCatalogue(ms)
	if ps := mesh.Check(ms); mesh.HasErrors(ps) {
		tb.Fatalf("test catalogue has problems: %v", ps)
	}
	return c
}

// MeshManifests reads the example fleet's own modules.
func MeshManifests(tb testing.TB) []*mesh.Manifest {
	tb.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	var ms []*mesh.Manifest
	for _, name := range MeshModules {
		file := filepath.Join(root, "examples/fleet/catalogue", name+".yaml")
		data, err := os.ReadFile(file)
		if err != nil {
			tb.Fatal(err)
		}
		m, ps := mesh.Parse(file, data)
		if mesh.HasErrors(ps) || m == nil {
			tb.Fatalf("%s: %v", file, ps)
		}
		ms = append(ms, m)
	}
	return ms
}

// Sharded sets the build seat of the manifests that declare it to shards
// shards (its `shards`), in place, and returns them.
func Sharded(ms []*mesh.Manifest, shards int) []*mesh.Manifest {
	for _, m := range ms {
		for i := range m.Seats {
			if m.Seats[i].Seat == mesh.BuildSeat {
				m.Seats[i].Shards = shards
			}
		}
	}
	return ms
}
