package mesh_test

import (
	"testing"

	"github.com/meshbuild/meshbuild/mesh"
)

// A build record's key is the module and the machine, a valid key-value
// key whatever the machine is called, and splits back at its first dot.
func TestBuildRecordKey(t *testing.T) {
	for _, tc := range []struct{ module, machine, key, back string }{
		{"tool-01", "build-1", "tool-01.build-1", "build-1"},
		{"base", "host.example.com", "base.host.example.com", "host.example.com"},
		{"base", "my host!", "base.my-host-", "my-host-"},
		{"base", "..odd..name.", "base.odd.name", "odd.name"},
		{"base", "", "base.-", "-"},
	} {
		key := mesh.BuildRecordKey(tc.module, tc.machine)
		if key != tc.key {
			t.Errorf("BuildRecordKey(%q, %q) = %q, want %q", tc.module, tc.machine, key, tc.key)
		}
		if m, machine, ok := mesh.SplitBuildRecordKey(key); !ok || m != tc.module || machine != tc.back {
			t.Errorf("SplitBuildRecordKey(%q) = %q, %q, %v; want %q, %q", key, m, machine, ok, tc.module, tc.back)
		}
	}
	if mesh.AgentBuildsRef() != "build-agent.builds" {
		t.Errorf("AgentBuildsRef() = %q", mesh.AgentBuildsRef())
	}
}
