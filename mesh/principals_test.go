package mesh_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/mesh"
)

// PrincipalPermissions picks each principal's one derivation and adds
// nothing; JWTPermissions carries the same allow lists, and an empty list
// denies everything rather than allowing it.
func TestPrincipalPermissions(t *testing.T) {
	cat, problems, err := mesh.Load(filepath.Join("..", "examples", "fleet", "catalogue"))
	if err != nil || mesh.HasErrors(problems) {
		t.Fatalf("the example fleet: %v %v", err, problems)
	}
	git, _ := cat.Module("git")
	for _, tc := range []struct {
		kind, name string
		want       mesh.Permissions
	}{
		{mesh.KindController, "", cat.ControllerPermissions(mesh.ControllerPrincipal)},
		{mesh.KindOperator, "", cat.OperatorPermissions(mesh.OperatorPrincipal)},
		{mesh.KindAgent, "m1", mustPerms(cat.MachinePermissions("m1"))},
		{mesh.KindNode, "m1", cat.NodeStatePermissions("m1", []string{mesh.AgentModule})},
		{mesh.KindModule, "git", cat.ModulePermissions(git)},
	} {
		got, err := cat.PrincipalPermissions(tc.kind, tc.name)
		if err != nil {
			t.Errorf("%s %s: %v", tc.kind, tc.name, err)
			continue
		}
		if !slices.Equal(got.Publish, tc.want.Publish) || !slices.Equal(got.Subscribe, tc.want.Subscribe) || got.Responses != tc.want.Responses {
			t.Errorf("%s %s: %+v, want %+v", tc.kind, tc.name, got, tc.want)
		}
		jp := got.JWTPermissions()
		if !slices.Equal([]string(jp.Pub.Allow), mesh.AllowList(got.Publish)) || !slices.Equal([]string(jp.Sub.Allow), mesh.AllowList(got.Subscribe)) || (jp.Resp != nil) != got.Responses {
			t.Errorf("%s %s: JWT permissions %+v, want the derived set %+v", tc.kind, tc.name, jp, got)
		}
	}
	for _, bad := range [][2]string{{"wizard", ""}, {mesh.KindNode, ""}, {mesh.KindNode, "A.b"}, {mesh.KindModule, ""}, {mesh.KindModule, "nosuch"}} {
		if _, err := cat.PrincipalPermissions(bad[0], bad[1]); err == nil {
			t.Errorf("PrincipalPermissions(%q, %q) has no error", bad[0], bad[1])
		}
	}
	if jp := (mesh.Permissions{Principal: "p"}).JWTPermissions(); len(jp.Pub.Allow) != 0 || !slices.Equal([]string(jp.Pub.Deny), []string{">"}) || !slices.Equal([]string(jp.Sub.Deny), []string{">"}) {
		t.Errorf("an empty set's JWT permissions %+v: want everything denied", jp)
	}
}

// A node's credentials carry the buckets of the modules it carries (the
// build agent by default): write on the agent's own state, nothing on any
// other module's; naming a module the catalogue lacks is refused, and a
// catalogue without a build agent issues the node its own set only.
func TestNodeCredentialsCarryTheirModulesBuckets(t *testing.T) {
	cat, problems, err := mesh.Load(filepath.Join("..", "examples", "fleet", "catalogue"))
	if err != nil || mesh.HasErrors(problems) {
		t.Fatalf("the example fleet: %v %v", err, problems)
	}
	p, err := cat.PrincipalPermissions(mesh.KindNode, "m1")
	if err != nil {
		t.Fatal(err)
	}
	// Its own records only (issue 19).
	builds := mesh.KVKeySubject(mesh.KVBucket(mesh.AgentModule, mesh.AgentBuildsBucket), mesh.BuildRecordKey("*", "m1"))
	if !slices.Contains(p.Publish, builds) {
		t.Errorf("node m1 may not write the agent's records (%s): %v", builds, p.Publish)
	}
	if all := mesh.KVSubjects(mesh.KVBucket(mesh.AgentModule, mesh.AgentBuildsBucket)); slices.Contains(p.Publish, all) {
		t.Errorf("node m1 may write every machine's records: %v", p.Publish)
	}
	if plans := mesh.KVSubjects(mesh.KVBucket("build-controller", "plans")); slices.Contains(p.Publish, plans) {
		t.Errorf("node m1 may write the controller's plans: %v", p.Publish)
	}
	for _, g := range mesh.NodePermissions("m1").Publish {
		if !slices.Contains(p.Publish, g) {
			t.Errorf("node m1 lost its own grant %s", g)
		}
	}
	if _, err := cat.NodePrincipalPermissions("m1", []string{"nosuch"}); err == nil || !strings.Contains(err.Error(), `"nosuch"`) {
		t.Errorf("carrying a module the catalogue lacks: %v, want a refusal naming it", err)
	}
	bare, err := (&mesh.Catalogue{}).PrincipalPermissions(mesh.KindNode, "m1")
	if err != nil || !slices.Equal(bare.Publish, mesh.NodePermissions("m1").Publish) {
		t.Errorf("a catalogue without a build agent: %v, %v; want the node's own set", bare.Publish, err)
	}
}

// The farm's own manifests the example fleet writes out are the ones the
// farm carries, byte for byte: tests read the example's files.
func TestTheExampleFleetsFarmManifestsAreTheFarms(t *testing.T) {
	for name, want := range mesh.FarmManifests() {
		got, err := os.ReadFile(filepath.Join("..", "examples", "fleet", "catalogue", name))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("examples/fleet/catalogue/%s differs from mesh/farm/%s: copy mesh/farm's", name, name)
		}
	}
}

// AllowList drops only the subjects another of the list allows: the server
// is given a shorter list that allows exactly the same.
func TestAllowListDropsWhatAWildcardAllows(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"$JS.API.>", "$JS.API.STREAM.INFO.KV_a", "$KV.a.>"}, []string{"$JS.API.>", "$KV.a.>"}},
		{[]string{"a.*.c", "a.b.c", "a.b.d"}, []string{"a.*.c", "a.b.d"}},
		{[]string{"a.*", "a.>"}, []string{"a.>"}},
		{[]string{"a.*", "a.b.c"}, []string{"a.*", "a.b.c"}},
		{[]string{"a.>", "a"}, []string{"a.>", "a"}},
		{[]string{"x.y", "x.y.z"}, []string{"x.y", "x.y.z"}},
	} {
		if got := mesh.AllowList(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("AllowList(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func mustPerms(p mesh.Permissions, err error) mesh.Permissions {
	if err != nil {
		panic(err)
	}
	return p
}
