package planner

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/mesh"
)

const (
	fleet  = "https://git.example/fleet.git"
	tools  = "https://git.example/tools.git"
	commit = "9fceb02d0ae598e95dc970b74767f19372d61af8"
)

// mod is a built module from repo at path, built on bases.
func mod(name, repo, path string, on ...string) *mesh.Manifest {
	return &mesh.Manifest{Module: name, Build: &mesh.Build{Repo: repo, Path: path, On: on}}
}

func catalogue(ms ...*mesh.Manifest) *mesh.Catalogue { return mesh.NewCatalogue(ms) }

func push(repo string, paths ...string) Trigger {
	return Trigger{Kind: KindPush, Repo: repo, Commit: commit, Ref: "refs/heads/main", Paths: paths}
}

func rebuild(modules ...string) Trigger {
	return Trigger{Kind: KindRebuild, Modules: modules, ID: "req-1"}
}

func mustPlan(t *testing.T, c *mesh.Catalogue, tr Trigger) Plan {
	t.Helper()
	p, err := New(c, tr)
	if err != nil {
		t.Fatalf("New(%v): %v", tr, err)
	}
	return p
}

func tiersOf(p Plan) [][]string { return p.Tiers }

func node(t *testing.T, p Plan, name string) Node {
	t.Helper()
	n, ok := p.Node(name)
	if !ok {
		t.Fatalf("plan has no node %q; has %v", name, p.Names())
	}
	return n
}

func TestPlanShapes(t *testing.T) {
	fan := []*mesh.Manifest{mod("base", fleet, "base")}
	var fanTier []string
	for i := range 35 {
		name := "tool-" + string(rune('a'+i/26)) + string(rune('a'+i%26))
		fan = append(fan, mod(name, tools, name, "base"))
		fanTier = append(fanTier, name)
	}
	tests := []struct {
		name    string
		modules []*mesh.Manifest
		trigger Trigger
		tiers   [][]string
		bases   map[string][]string // in-plan bases of some nodes
	}{
		{
			name:    "chain",
			modules: []*mesh.Manifest{mod("a", fleet, "a"), mod("b", fleet, "b", "a"), mod("c", tools, "c", "b")},
			trigger: rebuild("a"),
			tiers:   [][]string{{"a"}, {"b"}, {"c"}},
			bases:   map[string][]string{"a": nil, "b": {"a"}, "c": {"b"}},
		},
		{
			name:    "chain from the middle",
			modules: []*mesh.Manifest{mod("a", fleet, "a"), mod("b", fleet, "b", "a"), mod("c", tools, "c", "b")},
			trigger: rebuild("b"),
			tiers:   [][]string{{"b"}, {"c"}},
			bases:   map[string][]string{"b": nil, "c": {"b"}},
		},
		{
			name: "diamond",
			modules: []*mesh.Manifest{
				mod("a", fleet, "a"), mod("b", tools, "b", "a"), mod("c", tools, "c", "a"), mod("d", tools, "d", "b", "c"),
			},
			trigger: push(fleet),
			tiers:   [][]string{{"a"}, {"b", "c"}, {"d"}},
			bases:   map[string][]string{"d": {"b", "c"}},
		},
		{
			name:    "fan of 35",
			modules: fan,
			trigger: push(fleet, "base/Dockerfile"),
			tiers:   [][]string{{"base"}, fanTier},
		},
		{
			name: "tier is the longest path",
			// a→b→c and a→c: c is tier 2, not 1.
			modules: []*mesh.Manifest{mod("a", fleet, "a"), mod("b", fleet, "b", "a"), mod("c", fleet, "c", "a", "b")},
			trigger: rebuild("a"),
			tiers:   [][]string{{"a"}, {"b"}, {"c"}},
			bases:   map[string][]string{"c": {"a", "b"}},
		},
		{
			name: "two seeds, one built on the other",
			modules: []*mesh.Manifest{
				mod("a", fleet, "a"), mod("b", fleet, "b", "a"), mod("x", tools, "x"), mod("y", tools, "y", "b", "x"),
			},
			trigger: rebuild("b", "a", "b"),
			tiers:   [][]string{{"a"}, {"b"}, {"y"}},
			bases:   map[string][]string{"y": {"b"}},
		},
		{
			name:    "module built on a module that is not built",
			modules: []*mesh.Manifest{{Module: "docs"}, mod("a", fleet, "a", "docs", "ghost")},
			trigger: push(fleet),
			tiers:   [][]string{{"a"}},
			bases:   map[string][]string{"a": nil},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := mustPlan(t, catalogue(tc.modules...), tc.trigger)
			if got := tiersOf(p); !reflect.DeepEqual(got, tc.tiers) {
				t.Fatalf("tiers = %v, want %v", got, tc.tiers)
			}
			for name, want := range tc.bases {
				if got := node(t, p, name).InPlanBases; !reflect.DeepEqual(got, want) {
					t.Errorf("%s: in-plan bases = %v, want %v", name, got, want)
				}
			}
			// Modules are sorted by (tier, name) and agree with Tiers.
			var flat []string
			for _, tier := range tc.tiers {
				flat = append(flat, tier...)
			}
			if got := p.Names(); !reflect.DeepEqual(got, flat) {
				t.Errorf("modules = %v, want %v", got, flat)
			}
			for _, n := range p.Modules {
				if p.Tiers[n.Tier] == nil || !contains(p.Tiers[n.Tier], n.Module) {
					t.Errorf("%s: tier %d does not list it", n.Module, n.Tier)
				}
				for _, b := range n.InPlanBases {
					if bn := node(t, p, b); bn.Tier >= n.Tier {
						t.Errorf("%s (tier %d) is built on %s (tier %d)", n.Module, n.Tier, b, bn.Tier)
					}
				}
			}
		})
	}
}

func TestPlanDiamondDetails(t *testing.T) {
	c := catalogue(
		mod("os", "https://git.example/os.git", ""),
		mod("a", fleet, "a", "os"), mod("b", tools, "b", "a"), mod("c", tools, "c", "a", "os"), mod("d", tools, "d", "c", "b"),
	)
	p := mustPlan(t, c, push(fleet))
	want := []Node{
		{Module: "a", Tier: 0, On: []string{"os"}, Dependents: []string{"b", "c"}, Reason: "built from " + fleet + " path a",
			Source: Source{Repo: fleet, Commit: commit, Path: "a", Dockerfile: "Dockerfile", Platforms: []string{"linux/amd64"}}},
		{Module: "b", Tier: 1, On: []string{"a"}, InPlanBases: []string{"a"}, Dependents: []string{"d"}, Reason: "built on a (in plan)",
			Source: Source{Repo: tools, Path: "b", Dockerfile: "Dockerfile", Platforms: []string{"linux/amd64"}}},
		{Module: "c", Tier: 1, On: []string{"a", "os"}, InPlanBases: []string{"a"}, Dependents: []string{"d"}, Reason: "built on a (in plan)",
			Source: Source{Repo: tools, Path: "c", Dockerfile: "Dockerfile", Platforms: []string{"linux/amd64"}}},
		{Module: "d", Tier: 2, On: []string{"c", "b"}, InPlanBases: []string{"b", "c"}, Reason: "built on b, c (in plan)",
			Source: Source{Repo: tools, Path: "d", Dockerfile: "Dockerfile", Platforms: []string{"linux/amd64"}}},
	}
	if !reflect.DeepEqual(p.Modules, want) {
		t.Fatalf("modules:\n got %+v\nwant %+v", p.Modules, want)
	}
	wantExt := []External{{Module: "os", NeededBy: []string{"a", "c"}}}
	if !reflect.DeepEqual(p.External, wantExt) {
		t.Fatalf("external = %+v, want %+v", p.External, wantExt)
	}
	if p.ID != PlanID(push(fleet)) || p.Empty() {
		t.Fatalf("id %q, empty %v", p.ID, p.Empty())
	}
}

func TestPlanPathFiltering(t *testing.T) {
	c := catalogue(
		mod("runtime", fleet, "runtime"),
		mod("runtimes", fleet, "runtimes/"),
		mod("nested", fleet, "./services/api"),
		&mesh.Manifest{Module: "outside", Build: &mesh.Build{Repo: fleet, Path: "svc", Dockerfile: "../docker/svc.Dockerfile"}},
		mod("whole", fleet+"/", "."),
		mod("root", fleet, ""),
		mod("tool", tools, "runtime", "runtime"),
		mod("other", tools, "runtime"),
	)
	tests := []struct {
		paths []string
		want  []string
	}{
		{nil, []string{"nested", "outside", "root", "runtime", "runtimes", "whole", "tool"}},
		{[]string{"runtime/Dockerfile"}, []string{"root", "runtime", "whole", "tool"}},
		{[]string{"runtime"}, []string{"root", "runtime", "whole", "tool"}},
		{[]string{"/runtime/bin/x"}, []string{"root", "runtime", "whole", "tool"}},
		{[]string{"runtimes/x"}, []string{"root", "runtimes", "whole"}},
		{[]string{"services/api/main.go"}, []string{"nested", "root", "whole"}},
		{[]string{"services/apix"}, []string{"root", "whole"}},
		{[]string{"docker/svc.Dockerfile"}, []string{"outside", "root", "whole"}},
		{[]string{"docker/svc.Dockerfile.dockerignore"}, []string{"outside", "root", "whole"}},
		{[]string{"docker/other.Dockerfile"}, []string{"root", "whole"}},
		{[]string{"svc/app.py"}, []string{"outside", "root", "whole"}},
		{[]string{"README.md"}, []string{"root", "whole"}},
		// A directory that holds a context (or a Dockerfile): everything
		// under it may have changed.
		{[]string{"services"}, []string{"nested", "root", "whole"}},
		{[]string{"services/"}, []string{"nested", "root", "whole"}},
		{[]string{"docker"}, []string{"outside", "root", "whole"}},
		{[]string{"serv"}, []string{"root", "whole"}},
		{[]string{"/"}, []string{"nested", "outside", "root", "runtime", "runtimes", "whole", "tool"}},
		{[]string{"."}, []string{"nested", "outside", "root", "runtime", "runtimes", "whole", "tool"}},
		{[]string{"", "  "}, []string{"nested", "outside", "root", "runtime", "runtimes", "whole", "tool"}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.paths, ","), func(t *testing.T) {
			p := mustPlan(t, c, push(fleet, tc.paths...))
			if got := p.Names(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("modules = %v, want %v", got, tc.want)
			}
		})
	}

	p := mustPlan(t, c, push(fleet, "runtime/Dockerfile", "runtime/a", "README.md"))
	reasons := map[string]string{
		"runtime": "changed path runtime/Dockerfile (and 1 more)",
		"root":    "changed path README.md (and 2 more)",
		"tool":    "built on runtime (in plan)",
	}
	for name, want := range reasons {
		if got := node(t, p, name).Reason; got != want {
			t.Errorf("%s: reason %q, want %q", name, got, want)
		}
	}
	if got := node(t, mustPlan(t, c, push(fleet)), "root").Reason; got != "built from "+fleet {
		t.Errorf("root: reason %q", got)
	}
	if got := node(t, mustPlan(t, c, push(fleet)), "nested").Reason; got != "built from "+fleet+" path services/api" {
		t.Errorf("nested: reason %q", got)
	}
}

func TestPlanRepoNormalisation(t *testing.T) {
	c := catalogue(mod("a", "https://git.example/fleet.git", "a"), mod("b", "https://git.example/fleet/", "b"),
		mod("c", "https://git.example/fleet", "c"), mod("x", "https://git.example/fleet2.git", "x"),
		mod("local", "/srv/git/fleet/", "l"))
	id := PlanID(push("https://git.example/fleet"))
	for _, repo := range []string{
		"https://git.example/fleet.git",
		"https://git.example/fleet",
		"https://git.example/fleet/",
		"https://git.example/fleet.git/",
		" https://git.example/fleet.git ",
	} {
		t.Run(repo, func(t *testing.T) {
			p := mustPlan(t, c, push(repo))
			if got := p.Names(); !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
				t.Fatalf("modules = %v", got)
			}
			if p.ID != id {
				t.Errorf("plan id %s, want %s (one repository, one commit)", p.ID, id)
			}
			for _, n := range p.Modules {
				if n.Source.Commit != commit {
					t.Errorf("%s: commit %q", n.Module, n.Source.Commit)
				}
			}
		})
	}
	if got := mustPlan(t, c, push("/srv/git/fleet.git")).Names(); !reflect.DeepEqual(got, []string{"local"}) {
		t.Errorf("local path: %v", got)
	}
	for in, want := range map[string]string{
		"https://h/r.git": "https://h/r", "https://h/r.git/": "https://h/r", "https://h/r//": "https://h/r",
		"https://h/r.git.git": "https://h/r", "/srv/r": "/srv/r", "": "", "/": "",
	} {
		if got := NormaliseRepo(in); got != want {
			t.Errorf("NormaliseRepo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPlanEmpty(t *testing.T) {
	c := catalogue(mod("a", fleet, "a"), mod("b", tools, "b", "a"))
	for _, tr := range []Trigger{push("https://git.example/unknown.git"), push(fleet, "docs/x.md")} {
		p, err := New(c, tr)
		if err != nil {
			t.Fatalf("%v: %v", tr, err)
		}
		if !p.Empty() || len(p.Modules) != 0 || len(p.Tiers) != 0 {
			t.Fatalf("%v: want empty, got %v", tr, p.Names())
		}
		var out bytes.Buffer
		if err := p.Explain(&out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "nothing to build") {
			t.Errorf("explain of an empty plan:\n%s", out.String())
		}
		js, _ := json.Marshal(p)
		if !bytes.Contains(js, []byte(`"modules":[]`)) || !bytes.Contains(js, []byte(`"tiers":[]`)) {
			t.Errorf("empty plan JSON: %s", js)
		}
	}
	if p := mustPlan(t, catalogue(), push(fleet)); !p.Empty() {
		t.Errorf("empty catalogue gave %v", p.Names())
	}
}

func TestPlanErrors(t *testing.T) {
	c := catalogue(mod("a", fleet, "a"), mod("b", tools, "b", "a"), &mesh.Manifest{Module: "docs"})
	tests := []struct {
		name    string
		trigger Trigger
		want    error
		mention []string
	}{
		{"unknown module", rebuild("a", "nope"), ErrUnknownModule, []string{`"nope"`, "builds catalogue show"}},
		{"unknown modules", rebuild("x", "y"), ErrUnknownModule, []string{`"x", "y"`}},
		{"not built", rebuild("docs"), ErrNotBuilt, []string{`"docs"`, "build"}},
		{"unknown kind", Trigger{Kind: "pull", Repo: fleet, Commit: commit}, ErrTrigger, []string{`"pull"`}},
		{"push without repo", Trigger{Kind: KindPush, Commit: commit}, ErrTrigger, []string{"repo"}},
		{"push without commit", Trigger{Kind: KindPush, Repo: fleet}, ErrTrigger, []string{"commit"}},
		{"rebuild without modules", Trigger{Kind: KindRebuild, ID: "1"}, ErrTrigger, []string{"modules"}},
		{"rebuild without id", Trigger{Kind: KindRebuild, Modules: []string{"a"}}, ErrTrigger, []string{"id"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(c, tc.trigger)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
			if !p.Empty() || p.ID != "" {
				t.Errorf("a refused trigger gave a plan: %+v", p)
			}
		})
	}
}

func TestPlanCycle(t *testing.T) {
	// An unchecked catalogue: the planner refuses rather than loops.
	c := catalogue(mod("a", fleet, "a"), mod("b", fleet, "b", "a", "d"), mod("c", fleet, "c", "b"), mod("d", fleet, "d", "c"))
	_, err := New(c, rebuild("a"))
	if !errors.Is(err, ErrCycle) {
		t.Fatalf("err = %v, want ErrCycle", err)
	}
	if !strings.Contains(err.Error(), "b → d → c → b") {
		t.Errorf("error does not print the cycle: %v", err)
	}
}

func TestPlanCommits(t *testing.T) {
	c := catalogue(mod("a", fleet, "a"), mod("b", tools, "b", "a"), mod("c", fleet+"/", "c", "b"))
	p := mustPlan(t, c, push(fleet))
	for name, want := range map[string]string{"a": commit, "b": "", "c": commit} {
		if got := node(t, p, name).Source.Commit; got != want {
			t.Errorf("%s: commit %q, want %q", name, got, want)
		}
	}
	// A rebuild without a commit builds every module at its current commit.
	for _, n := range mustPlan(t, c, rebuild("a")).Modules {
		if n.Source.Commit != "" {
			t.Errorf("rebuild: %s has commit %q", n.Module, n.Source.Commit)
		}
	}
	// A rebuild naming a repository and commit pins that repository's modules.
	tr := rebuild("a")
	tr.Repo, tr.Commit = fleet, commit
	p = mustPlan(t, c, tr)
	for name, want := range map[string]string{"a": commit, "b": "", "c": commit} {
		if got := node(t, p, name).Source.Commit; got != want {
			t.Errorf("rebuild at commit: %s: commit %q, want %q", name, got, want)
		}
	}
	if got := node(t, p, "a").Reason; got != "asked for by rebuild" {
		t.Errorf("reason %q", got)
	}
}

func TestPlanSourceDefaults(t *testing.T) {
	c := catalogue(&mesh.Manifest{Module: "a", Build: &mesh.Build{Repo: fleet, Path: "a", Dockerfile: "build/Dockerfile.prod",
		Platforms: []string{"linux/amd64", "linux/arm64"}}}, mod("b", fleet, "b"))
	p := mustPlan(t, c, push(fleet))
	want := Source{Repo: fleet, Commit: commit, Path: "a", Dockerfile: "build/Dockerfile.prod", Platforms: []string{"linux/amd64", "linux/arm64"}}
	if got := node(t, p, "a").Source; !reflect.DeepEqual(got, want) {
		t.Errorf("source = %+v, want %+v", got, want)
	}
	if got := node(t, p, "b").Source; got.Dockerfile != mesh.DefaultDockerfile || !reflect.DeepEqual(got.Platforms, []string{mesh.DefaultPlatform}) {
		t.Errorf("defaults: %+v", got)
	}
	if got := want.Mesh(); got != (mesh.Source{Repo: fleet, Commit: commit, Path: "a", Dockerfile: "build/Dockerfile.prod"}) {
		t.Errorf("Mesh() = %+v", got)
	}
}

// build.compression reaches the ask: zstd as it is, gzip (the default)
// as nothing, so that a module's input key does not change when its
// manifest spells the default out.
func TestPlanCarriesTheCompression(t *testing.T) {
	c := catalogue(
		&mesh.Manifest{Module: "z", Build: &mesh.Build{Repo: fleet, Path: "z", Compression: mesh.CompressionZstd}},
		&mesh.Manifest{Module: "g", Build: &mesh.Build{Repo: fleet, Path: "g", Compression: mesh.CompressionGzip}},
		mod("d", fleet, "d"))
	p := mustPlan(t, c, push(fleet))
	for m, want := range map[string]string{"z": mesh.CompressionZstd, "g": "", "d": ""} {
		if got := node(t, p, m).Source.Mesh().Compression; got != want {
			t.Errorf("%s: the ask's compression %q, want %q", m, got, want)
		}
	}
}

func TestPlanIsAValue(t *testing.T) {
	platforms := []string{"linux/amd64"}
	on := []string{"a"}
	ms := []*mesh.Manifest{mod("a", fleet, "a"), {Module: "b", Build: &mesh.Build{Repo: fleet, Path: "b", On: on, Platforms: platforms}}}
	tr := push(fleet, "a/x", "b/y")
	p := mustPlan(t, catalogue(ms...), tr)
	before, _ := json.Marshal(p)
	tr.Paths[0] = "changed"
	platforms[0] = "changed"
	on[0] = "changed"
	after, _ := json.Marshal(p)
	if !bytes.Equal(before, after) {
		t.Fatalf("changing the inputs changed the plan:\n%s\n%s", before, after)
	}
}

func TestPlanDeterministic(t *testing.T) {
	ms := layered(500, 6, 3, 7)
	tr := push(repoOf(0))
	c := catalogue(ms...)
	want, err := json.Marshal(mustPlan(t, c, tr))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 5 {
		shuffled := append([]*mesh.Manifest(nil), ms...)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		got, err := json.Marshal(mustPlan(t, catalogue(shuffled...), tr))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("run %d: the same catalogue in another order gave other bytes", i)
		}
	}
	// An Index plans many triggers, concurrently, with the same result.
	ix := NewIndex(c)
	done := make(chan []byte)
	for range 4 {
		go func() {
			p, _ := ix.Plan(tr)
			b, _ := json.Marshal(p)
			done <- b
		}()
	}
	for range 4 {
		if got := <-done; !bytes.Equal(got, want) {
			t.Fatal("concurrent Index.Plan differs")
		}
	}
}

func TestPlanJSON(t *testing.T) {
	c := catalogue(mod("os", tools, "os"), mod("a", fleet, "a", "os"), mod("b", fleet, "b", "a"))
	p := mustPlan(t, c, push(fleet, "a/Dockerfile"))
	js, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"id":`, `"trigger":`, `"kind":"push"`, `"modules":`, `"tiers":`, `"external":`,
		`"module":`, `"tier":`, `"on":`, `"in_plan_bases":`, `"dependents":`, `"reason":`, `"source":`, `"needed_by":`,
		`"repo":`, `"commit":`, `"path":`, `"dockerfile":`, `"platforms":`, `"paths":`} {
		if !bytes.Contains(js, []byte(key)) {
			t.Errorf("JSON has no %s: %s", key, js)
		}
	}
	if regexp.MustCompile(`"[A-Za-z]*[A-Z][A-Za-z]*":`).Match(js) {
		t.Errorf("JSON has a key that is not lower_snake: %s", js)
	}
	var back Plan
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, p) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, p)
	}
}

func TestPlanID(t *testing.T) {
	idRE := regexp.MustCompile(`^[A-Za-z0-9_-]{1,42}$`)
	p1 := PlanID(push(fleet))
	if !regexp.MustCompile(`^p-[0-9a-f]{12}$`).MatchString(p1) {
		t.Errorf("push plan id %q", p1)
	}
	if p1 != PlanID(Trigger{Kind: KindPush, Repo: "https://git.example/fleet/", Commit: commit, Ref: "other", Paths: []string{"x"}}) {
		t.Error("the plan id of a push depends on more than repository and commit")
	}
	if p1 == PlanID(Trigger{Kind: KindPush, Repo: fleet, Commit: "0" + commit[1:]}) || p1 == PlanID(push(tools)) {
		t.Error("different pushes share a plan id")
	}
	tests := []struct{ id, want string }{
		{"42", "r-42"},
		{"req_7-a", "r-req_7-a"},
		{"0123456789012345678901234567890123456789", "r-0123456789012345678901234567890123456789"},
	}
	for _, tc := range tests {
		if got := PlanID(Trigger{Kind: KindRebuild, ID: tc.id, Modules: []string{"a"}}); got != tc.want {
			t.Errorf("PlanID(rebuild %q) = %q, want %q", tc.id, got, tc.want)
		}
	}
	for _, id := range []string{strings.Repeat("x", 41), "a.b", "a b", "ünï", "with/slash", ""} {
		got := PlanID(Trigger{Kind: KindRebuild, ID: id})
		if !regexp.MustCompile(`^r-[0-9a-f]{12}$`).MatchString(got) {
			t.Errorf("PlanID(rebuild %q) = %q, want r- and a hash", id, got)
		}
		if !idRE.MatchString(got) {
			t.Errorf("%q is not a plan id", got)
		}
	}
	if PlanID(Trigger{Kind: KindRebuild, ID: "a.b"}) == PlanID(Trigger{Kind: KindRebuild, ID: "a_b"}) {
		t.Error("two request ids share a plan id")
	}
}

func TestDependents(t *testing.T) {
	c := catalogue(mod("a", fleet, "a"), mod("c", fleet, "c", "a", "a"), mod("b", fleet, "b", "a", "ghost"), mod("d", fleet, "d", "b", "c"))
	want := map[string][]string{"a": {"b", "c"}, "b": {"d"}, "c": {"d"}}
	if got := Dependents(c); !reflect.DeepEqual(got, want) {
		t.Errorf("Dependents = %v, want %v", got, want)
	}
	if n := NewIndex(c).Len(); n != 4 {
		t.Errorf("Len = %d", n)
	}
}

func TestExplain(t *testing.T) {
	c := catalogue(
		mod("os", tools, "os"),
		mod("runtime", fleet, "runtime", "os"),
		mod("tool-a", tools, "tool-a", "runtime"),
		mod("tool-b", tools, "tool-b", "runtime", "os"),
		mod("app", fleet, "app", "tool-a", "tool-b"),
	)
	p := mustPlan(t, c, push(fleet, "runtime/Dockerfile"))
	var out bytes.Buffer
	if err := p.Explain(&out); err != nil {
		t.Fatal(err)
	}
	want := "plan " + p.ID + ": push https://git.example/fleet.git@9fceb02 (refs/heads/main), changed runtime/Dockerfile\n" +
		`4 modules in 3 tiers, 1 external base kept at the current digest

TIER  MODULE   REASON                             COMMIT
0     runtime  changed path runtime/Dockerfile    9fceb02
1     tool-a   built on runtime (in plan)         (current)
      tool-b   built on runtime (in plan)         (current)
2     app      built on tool-a, tool-b (in plan)  9fceb02

EXTERNAL BASE  NEEDED BY
os             runtime, tool-b
`
	if got := out.String(); got != want {
		t.Errorf("explain:\n%s\nwant:\n%s", got, want)
	}
}

func TestExplainWriteError(t *testing.T) {
	p := mustPlan(t, catalogue(mod("a", fleet, "a")), push(fleet))
	if err := p.Explain(failWriter{}); !errors.Is(err, errWrite) {
		t.Fatalf("err = %v", err)
	}
}

var errWrite = errors.New("disk full")

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errWrite }

func TestTriggerString(t *testing.T) {
	for _, tc := range []struct {
		t    Trigger
		want string
	}{
		{push(fleet), "push " + fleet + "@9fceb02 (refs/heads/main)"},
		{push(fleet, "a", "b"), "push " + fleet + "@9fceb02 (refs/heads/main), 2 changed paths"},
		{rebuild("a", "b"), "rebuild a, b (request req-1)"},
	} {
		if got := tc.t.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

func contains(s []string, x string) bool {
	for _, e := range s {
		if e == x {
			return true
		}
	}
	return false
}

func repoOf(layer int) string {
	return "https://git.example/layer" + string(rune('a'+layer%26)) + ".git"
}

// layered is a catalogue of n modules in the given number of layers; each
// module of layer k > 0 is built on up to fanIn modules of earlier layers, at
// least one of layer k-1, and each layer is its own repository.
func layered(n, layers, fanIn int, seed uint64) []*mesh.Manifest {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	per := n / layers
	names := make([]string, n)
	out := make([]*mesh.Manifest, n)
	layerOf := func(i int) int { return min(i/per, layers-1) }
	for i := range n {
		names[i] = "m" + itoa(i)
	}
	for i := range n {
		l := layerOf(i)
		var on []string
		if l > 0 {
			lo := (l - 1) * per
			on = append(on, names[lo+rng.IntN(per)])
			for k := 1; k < 1+rng.IntN(fanIn); k++ {
				on = append(on, names[rng.IntN(l*per)])
			}
		}
		out[i] = mod(names[i], repoOf(l), names[i], on...)
	}
	return out
}

func itoa(i int) string {
	const digits = "0123456789"
	s := []byte{digits[i/10000%10], digits[i/1000%10], digits[i/100%10], digits[i/10%10], digits[i%10]}
	return string(s)
}

func TestBuiltOnReason(t *testing.T) {
	for _, tc := range []struct {
		bases []string
		want  string
	}{
		{[]string{"a"}, "built on a (in plan)"},
		{[]string{"a", "b", "c"}, "built on a, b, c (in plan)"},
		{[]string{"a", "b", "c", "d", "e"}, "built on a, b, c and 2 more (in plan)"},
	} {
		if got := builtOn(tc.bases); got != tc.want {
			t.Errorf("builtOn(%v) = %q, want %q", tc.bases, got, tc.want)
		}
	}
}
