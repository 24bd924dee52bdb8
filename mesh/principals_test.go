package mesh_test

import (
	"path/filepath"
	"slices"
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
	agent, _ := cat.Module(mesh.AgentModule)
	git, _ := cat.Module("git")
	for _, tc := range []struct {
		kind, name string
		want       mesh.Permissions
	}{
		{mesh.KindController, "", cat.ControllerPermissions(mesh.ControllerPrincipal)},
		{mesh.KindOperator, "", cat.OperatorPermissions(mesh.OperatorPrincipal)},
		{mesh.KindAgent, "", cat.ModulePermissions(agent)},
		{mesh.KindNode, "m1", mesh.NodePermissions("m1")},
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
		if !slices.Equal([]string(jp.Pub.Allow), got.Publish) || !slices.Equal([]string(jp.Sub.Allow), got.Subscribe) || (jp.Resp != nil) != got.Responses {
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
