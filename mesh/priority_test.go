package mesh

import "testing"

func TestBuildPriorityFor(t *testing.T) {
	b := &Build{Repo: "r", Priority: map[string]int{"main": 10, "refs/tags/v1": 5, AnyRef: -1}}
	for _, tc := range []struct {
		ref  string
		want int
		ok   bool
	}{
		{"refs/heads/main", 10, true},
		{"main", 10, true},
		{"refs/tags/v1", 5, true},
		{"refs/heads/feature", -1, true},
		{"", -1, true},
	} {
		if got, ok := b.PriorityFor(tc.ref); got != tc.want || ok != tc.ok {
			t.Errorf("PriorityFor(%q) = %d, %v; want %d, %v", tc.ref, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := (&Build{Repo: "r", Priority: map[string]int{"main": 1}}).PriorityFor("refs/heads/dev"); ok {
		t.Error("a ref not declared, without *, has a priority")
	}
}

func TestCheckPriority(t *testing.T) {
	runCheckCases(t, []checkCase{
		{name: "a table beside build.repo", files: map[string]string{
			"a.yaml": "module: a\nbuild:\n  repo: https://git.example/a.git\n  priority: {main: 10, \"*\": 0}\n",
			"b.yaml": "module: b\nbuild:\n  repo: https://git.example/a\n  priority: {\"*\": 0, main: 10}\n",
		}},
		{name: "out of bounds, not a ref", files: map[string]string{
			"a.yaml": "module: a\nbuild:\n  repo: r\n  priority: {main: 1001, \"bad ref\": 1, \"x..y\": 2}\n",
		}, want: []want{
			{file: "a.yaml", field: "build.priority.main", text: "priority 1001: write a whole number from -1000 to 1000"},
			{file: "a.yaml", field: "build.priority.bad ref", text: `"bad ref" is not a ref`},
			{file: "a.yaml", field: "build.priority.x..y", text: `"x..y" is not a ref`},
		}},
		{name: "two modules of one repository disagree", files: map[string]string{
			"a.yaml": "module: a\nbuild:\n  repo: https://git.example/a.git\n  priority: {main: 10}\n",
			"b.yaml": "module: b\nbuild:\n  repo: https://git.example/a/\n  priority: {main: 5}\n",
		}, want: []want{
			{file: "b.yaml", field: "build.priority", text: "a push of a repository has one priority; write the same table in both"},
		}},
	})
}
