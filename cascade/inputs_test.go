package cascade

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
)

// keyed is a key → record table as the controller keeps it.
type keyed map[string]KeyRecord

func (k keyed) lookup(key string) (KeyRecord, bool) { r, ok := k[key]; return r, ok }

// record keeps what a settled plan built, as the controller does on built.
func (k keyed) record(s *State) {
	for _, m := range s.Modules {
		if m.State == Built && m.Key != "" {
			k[m.Key] = KeyRecord{Digest: m.Digest, Image: m.Image, Module: m.Module, Plan: s.Plan}
		}
	}
}

// addressed is a new state of "base: ; app: base; tool: app" with the
// given trees, looking keys up in known.
func addressed(t *testing.T, id string, trees map[string]string, known keyed, force bool) *State {
	t.Helper()
	p := plan(t, "base:", "app: base", "tool: app")
	p.ID = id
	p.Trigger.Force = force
	s := NewState(p, t0)
	in := map[string]Inputs{}
	for m, tree := range trees {
		in[m] = Inputs{Commit: "c0ffee" + id, Tree: tree}
	}
	s.Address(in)
	s.SetKnown(known.lookup)
	return s
}

func TestInputKeysSettleUnchangedAndCutTheCascadeOff(t *testing.T) {
	trees := map[string]string{"base": "tree-base-1", "app": "tree-app", "tool": "tree-tool"}
	known := keyed{}
	d1 := digest("base", 1)

	// The first plan builds everything; every ask carries its key.
	s1 := addressed(t, "p1", trees, known, false)
	b := s1.Start(at(0))
	wantModules(t, b, "base")
	if b[0].Key == "" || b[0].Source.Commit != "c0ffeep1" || b[0].Tree != "tree-base-1" {
		t.Fatalf("base's ask %+v: want a key, the resolved commit and its tree", b[0])
	}
	if a := Asks("reg:5000", b[0]); a[0].Source.Tree != "tree-base-1" || a[0].Source.Commit != "c0ffeep1" {
		t.Fatalf("base's ask on the bus %+v: want the tree read at its commit", a[0].Source)
	}
	app := s1.Built(built(b[0], 1), at(1))
	wantModules(t, app, "app")
	tool := s1.Built(built(app[0], 2), at(2))
	s1.Built(built(tool[0], 3), at(3))
	if s1.Outcome() != OutcomeBuilt || s1.Counts().Unchanged != 0 {
		t.Fatalf("p1 %s %+v", s1.Outcome(), s1.Counts())
	}
	known.record(s1)
	if len(known) != 3 {
		t.Fatalf("keys %v", known)
	}

	// A README in base's context: base is built again (its tree changed),
	// comes out with the digest it had, and the cascade stops there.
	trees["base"] = "tree-base-2"
	s2 := addressed(t, "p2", trees, known, false)
	b = s2.Start(at(10))
	wantModules(t, b, "base")
	ev := built(b[0], 11)
	ev.Digest, ev.Image = d1, "reg/base@"+d1
	if next := s2.Built(ev, at(11)); len(next) != 0 {
		t.Fatalf("the same digest released %v", modules(next))
	}
	wantStates(t, s2, map[string]ModuleState{"base": Built, "app": Unchanged, "tool": Unchanged})
	if got := s2.Reused(); !slices.Equal(got, []string{"app", "tool"}) {
		t.Fatalf("reused %v, want app then tool", got)
	}
	if got := s2.Reused(); len(got) != 0 {
		t.Fatalf("reused twice: %v", got)
	}
	if a := stateOf(t, s2, "app"); a.Reuses != "p1" || a.Digest != digest("app", 1) || a.Commit != "c0ffeep2" {
		t.Fatalf("app %+v: want p1's digest, reusing p1, at p2's commit", a)
	}
	if c := s2.Counts(); c.Built != 1 || c.Unchanged != 2 || s2.Outcome() != OutcomeBuilt {
		t.Fatalf("p2 %s %+v", s2.Outcome(), c)
	}
	if cur, ok := s2.Current("tool"); !ok || cur.Digest != digest("tool", 1) || cur.Plan != "p2" {
		t.Fatalf("tool's current from p2: %+v %v", cur, ok)
	}
	known.record(s2)

	// A change that changes base's image: everything downstream rebuilds.
	trees["base"] = "tree-base-3"
	s3 := addressed(t, "p3", trees, known, false)
	b = s3.Start(at(20))
	ev = built(b[0], 21)
	ev.Digest = digest("base", 99)
	app = s3.Built(ev, at(21))
	wantModules(t, app, "app")
	ev = built(app[0], 22)
	ev.Digest = digest("app", 99)
	tool = s3.Built(ev, at(22))
	wantModules(t, tool, "tool")
	s3.Built(built(tool[0], 23), at(23))
	if c := s3.Counts(); c.Built != 3 || c.Unchanged != 0 {
		t.Fatalf("p3 %+v", c)
	}
	known.record(s3)

	// Nothing changed since p3: nothing is dispatched, the plan settles
	// at once, built.
	s4 := addressed(t, "p4", trees, known, false)
	if subs := s4.Start(at(30)); len(subs) != 0 {
		t.Fatalf("nothing changed, submitted %v", modules(subs))
	}
	wantStates(t, s4, map[string]ModuleState{"base": Unchanged, "app": Unchanged, "tool": Unchanged})
	if !s4.Settled() || s4.Outcome() != OutcomeBuilt || stateOf(t, s4, "base").Reuses != "p3" {
		t.Fatalf("p4 %s %+v", s4.Outcome(), s4.Modules)
	}
	// The state survives a reload with its keys and reuses.
	data, _ := json.Marshal(s4)
	var back State
	if err := json.Unmarshal(data, &back); err != nil || !slices.EqualFunc(back.Modules, s4.Modules, func(a, b ModuleStatus) bool {
		return a.Key == b.Key && a.Tree == b.Tree && a.Reuses == b.Reuses && a.State == b.State
	}) {
		t.Fatalf("reload: %v %+v", err, back.Modules)
	}

	// Forced, the same inputs are built again.
	s5 := addressed(t, "p5", trees, known, true)
	wantModules(t, s5.Start(at(40)), "base")

	// A module whose context is not addressed has no key: always built.
	s6 := addressed(t, "p6", map[string]string{"base": trees["base"], "app": trees["app"]}, known, false)
	tool = s6.Start(at(50))
	wantModules(t, tool, "tool")
	if tool[0].Key != "" || tool[0].Source.Commit != "c0ffee" || tool[0].Tree != "" {
		t.Fatalf("unaddressed tool %+v: want no key, the plan's commit", tool[0])
	}
	wantStates(t, s6, map[string]ModuleState{"base": Unchanged, "app": Unchanged, "tool": Queued})
}

func TestInputKeyNamesEveryInput(t *testing.T) {
	bases := map[string]string{"os": "sha256:1", "rt": "sha256:2"}
	k := InputKey("app", "linux/amd64", "tree", "app", "Dockerfile", "", "", bases)
	if len(k) != 64 {
		t.Fatalf("key %q: want 64 hex digits", k)
	}
	if again := InputKey("app", "linux/amd64", "tree", "app", "Dockerfile", "", "", maps.Clone(bases)); again != k {
		t.Fatal("the same inputs gave two keys")
	}
	for name, other := range map[string]string{
		"module":      InputKey("app2", "linux/amd64", "tree", "app", "Dockerfile", "", "", bases),
		"platform":    InputKey("app", "linux/arm64", "tree", "app", "Dockerfile", "", "", bases),
		"tree":        InputKey("app", "linux/amd64", "tree2", "app", "Dockerfile", "", "", bases),
		"path":        InputKey("app", "linux/amd64", "tree", "app/x", "Dockerfile", "", "", bases),
		"dockerfile":  InputKey("app", "linux/amd64", "tree", "app", "Dockerfile.prod", "", "", bases),
		"base":        InputKey("app", "linux/amd64", "tree", "app", "Dockerfile", "", "", map[string]string{"os": "sha256:1", "rt": "sha256:3"}),
		"no base":     InputKey("app", "linux/amd64", "tree", "app", "Dockerfile", "", "", map[string]string{"os": "sha256:1"}),
		"base name":   InputKey("app", "linux/amd64", "tree", "app", "Dockerfile", "", "", map[string]string{"os": "sha256:1", "rs": "sha256:2"}),
		"ambiguous":   InputKey("app", "linux/amd64", "tree", "appDockerfile", "", "", "", bases),
		"compression": InputKey("app", "linux/amd64", "tree", "app", "Dockerfile", "", "zstd", bases),
		// A Dockerfile beside the context: its directory's tree.
		"dockerfile tree": InputKey("app", "linux/amd64", "tree", "app", "Dockerfile", "dtree", "", bases),
	} {
		if other == k {
			t.Errorf("changing the %s kept the key", name)
		}
	}
	// The default compression and a Dockerfile in the context add
	// nothing: keys made before build.compression (and before Dockerfiles
	// beside the context) are the same.
	h := sha256.New()
	for _, f := range [][2]string{{"key", "v1"}, {"module", "app"}, {"platform", "linux/amd64"}, {"tree", "tree"}, {"path", "app"}, {"dockerfile", "Dockerfile"}, {"base os", "sha256:1"}, {"base rt", "sha256:2"}} {
		fmt.Fprintf(h, "%s %d:%s\n", f[0], len(f[1]), f[1])
	}
	if old := hex.EncodeToString(h.Sum(nil)); old != k {
		t.Errorf("a gzip module's key changed: %s, was %s", k, old)
	}
}
