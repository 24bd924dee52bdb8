package mesh_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/mesh"
)

// The README's table of what each principal may reach is the derivation's,
// for the example catalogue: every subject and bucket grant each principal
// may publish (or write) and subscribe to. A derivation that changes fails
// here until the README says so (MESHBUILD_UPDATE_README=1 rewrites it).
func TestREADMEListsEachPrincipalsReach(t *testing.T) {
	root := filepath.Join("..")
	cat, problems, err := mesh.Load(filepath.Join(root, "examples", "fleet", "catalogue"))
	if err != nil || mesh.HasErrors(problems) {
		t.Fatalf("the example catalogue: %v %v", err, problems)
	}
	var b strings.Builder
	for _, p := range []struct{ kind, name string }{
		{mesh.KindController, ""}, {mesh.KindOperator, ""}, {mesh.KindAgent, "build-1"}, {mesh.KindNode, "build-1"},
	} {
		perms, err := cat.PrincipalPermissions(p.kind, p.name)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "<details><summary><code>%s</code> (%s): may publish %d, subscribe %d</summary>\n\n```\n",
			perms.Principal, strings.TrimSpace(p.kind+" "+p.name), len(perms.Publish), len(perms.Subscribe))
		for _, s := range perms.Publish {
			fmt.Fprintf(&b, "pub %s\n", s)
		}
		for _, s := range perms.Subscribe {
			fmt.Fprintf(&b, "sub %s\n", s)
		}
		b.WriteString("```\n</details>\n")
	}
	const begin, end = "<!-- principals:begin -->\n", "<!-- principals:end -->"
	file := filepath.Join(root, "README.md")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	i, j := strings.Index(readme, begin), strings.Index(readme, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %q … %q block", begin, end)
	}
	have, want := readme[i+len(begin):j], b.String()
	if have == want {
		return
	}
	if os.Getenv("MESHBUILD_UPDATE_README") != "" {
		if err := os.WriteFile(file, []byte(readme[:i+len(begin)]+want+readme[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("README.md's table of what each principal may reach is not the derivation's; rerun with MESHBUILD_UPDATE_README=1 to write it. Derived:\n%s", want)
}
