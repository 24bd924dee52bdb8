package mesh

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/parser"
)

var updateProblems = flag.Bool("update-problems", false, "rewrite testdata/*.golden from what Load reports")

// writeFiles writes a catalogue into a fresh temporary directory.
func writeFiles(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadCannotRead(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "shop.yaml")
	if err := os.WriteFile(file, []byte("module: shop\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noManifests := writeFiles(t, map[string]string{"README.md": "# not a manifest\n", ".hidden.yaml": "module: x\n"})
	if err := os.Mkdir(filepath.Join(noManifests, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		dir  string
		want error
		text string
	}{
		{"missing", filepath.Join(dir, "nope"), fs.ErrNotExist, "nope"},
		{"not a directory", file, ErrNotDirectory, file},
		{"empty", t.TempDir(), ErrNoManifests, "write one <module>.yaml per module"},
		{"no manifests", noManifests, ErrNoManifests, noManifests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ps, err := Load(tc.dir)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Load(%s) error = %v, want %v", tc.dir, err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("error %q does not say %q", err, tc.text)
			}
			if c != nil || ps != nil {
				t.Errorf("Load returned a catalogue or problems with its error")
			}
		})
	}
	if _, _, err := LoadFiles(nil); !errors.Is(err, ErrNoManifests) {
		t.Errorf("LoadFiles(nil) error = %v, want ErrNoManifests", err)
	}
}

func TestLoadDecoding(t *testing.T) {
	runCheckCases(t, []checkCase{{
		name: "malformed YAML in one file, the others still load",
		files: map[string]string{
			"bad.yaml":  "module: bad\nemits: [a, b\n",
			"tabs.yaml": "module: tabs\n\tserves: [x]\n",
			"good.yaml": "module: good\nemits: [done]\n",
		},
		want: []want{
			{file: "bad.yaml", text: "']' not found", line: 2},
			{file: "tabs.yaml", text: "cannot start any token", line: 2},
		},
	}, {
		name: "unknown keys name the line and what to write",
		files: map[string]string{"x.yaml": `module: x
emits: [done]
consume: [mesh-git.pushed]
seats:
  - seat: s
    scope: node
    accept: [build]
build:
  repo: r
  context: .
state:
  - {name: b, size: 10}
`},
		want: []want{
			{file: "x.yaml", field: "consume", text: `unknown key "consume": write "consumes"`, line: 3},
			{file: "x.yaml", field: "seats[0].accept", text: `write "accepts" (the keys of a seat are accepts, emits, scope, seat, serves, shards)`, line: 7},
			{file: "x.yaml", field: "build.context", text: "the keys of build are compression, dockerfile, on, path, platforms, priority, provenance, repo, sbom", line: 10},
			{file: "x.yaml", field: "state[0].size", text: "the keys of a state entry are history, name, ttl", line: 12},
		},
	}, {
		name: "wrong kinds of value",
		files: map[string]string{
			"a.yaml": "module: a\nemits: done\n",
			"b.yaml": "- module: b\n",
			"c.yaml": "module: c\nstate:\n  - name: x\n    history: many\n",
			"d.yaml": "module: d\nbuild: [r]\n",
			"e.yaml": "module: e\nbuild:\n  repo: r\n  provenance: maybe\n  sbom: false\n",
		},
		want: []want{
			{file: "a.yaml", field: "emits", text: "write a list", line: 2},
			{file: "b.yaml", text: "a manifest is a mapping", line: 1},
			{file: "c.yaml", field: "state[0].history", text: `cannot read "many" as a whole number`, line: 4},
			{file: "d.yaml", field: "build", text: "a mapping", line: 2},
			{file: "e.yaml", field: "build.provenance", text: `cannot read "maybe" as true or false: write true or false`, line: 4},
		},
	}, {
		name: "empty files, several documents and duplicate keys",
		files: map[string]string{
			"empty.yaml":    "",
			"comment.yml":   "# nothing yet\n",
			"two.yaml":      "module: one\n---\nmodule: two\n",
			"dupkey.yaml":   "module: a\nmodule: b\n",
			"anchored.yaml": "module: anchored\nemits: &e [done]\nseats:\n  - {seat: s, scope: node, emits: *e}\n",
		},
		want: []want{
			{file: "empty.yaml", text: "the manifest is empty: write `module: NAME`", line: 1},
			{file: "comment.yml", text: "the manifest is empty", line: 1},
			{file: "two.yaml", text: "a file holds one manifest", line: 3},
			{file: "dupkey.yaml", text: `mapping key "module" already defined`, line: 2},
		},
	}})
}

func TestLoadExampleFleet(t *testing.T) {
	c, ps, err := Load(filepath.Join("..", "examples", "fleet", "catalogue"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		t.Errorf("problem: %s", p)
	}
	if got := len(c.Modules); got != 42 {
		t.Errorf("%d modules, want 42", got)
	}
	if _, owner, ok := c.Seat(BuildSeat); !ok || owner != "build-agent" {
		t.Errorf("seat %s: owner %q, ok %v; want build-agent", BuildSeat, owner, ok)
	}
	agent, ok := c.Module("build-agent")
	if !ok {
		t.Fatal("no build-agent")
	}
	if want := filepath.Join("..", "examples", "fleet", "catalogue", "build-agent.yaml"); agent.File != want {
		t.Errorf("File = %q, want %q", agent.File, want)
	}
	acc, err := ParseAccept(agent.Seats[0].Accepts[0])
	if err != nil || acc != (Accept{Verb: BuildVerb, Retain: 7 * 24 * time.Hour}) {
		t.Errorf("ParseAccept = %+v, %v", acc, err)
	}
	if got := len(c.Built()); got != 39 {
		t.Errorf("%d built modules, want 39", got)
	}
	for _, name := range []string{"tool-01", "tool-35", "static-web"} {
		m, ok := c.Module(name)
		if !ok || m.Build == nil || m.Build.Repo != "https://git.example/fleet.git" {
			t.Errorf("module %s: %+v", name, m)
		}
	}
	if holders := c.Holders("mesh-git"); len(holders) != 1 || holders[0].Module != "git" {
		t.Errorf("holders of mesh-git: %v", holders)
	}
}

func TestLoadClean(t *testing.T) {
	dir := filepath.Join("testdata", "clean")
	c, ps, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Warning && strings.HasPrefix(p.File, "(farm)/") {
			continue // the farm's own modules, added (TestLoadAddsTheFarmsOwnModules)
		}
		t.Errorf("problem: %s", p)
	}
	if c.Dir != dir || len(c.Modules) != 2+3 || c.Modules[0].Module != "billing" {
		t.Errorf("catalogue %+v", c)
	}
}

// TestLoadBroken pins what Load says about a catalogue with one mistake of
// each kind; run with -update-problems after changing a message.
func TestLoadBroken(t *testing.T) {
	_, ps, err := Load(filepath.Join("testdata", "broken"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, p := range ps {
		if p.Warning {
			b.WriteString("warning: ")
		}
		b.WriteString(filepath.ToSlash(p.String()))
		b.WriteByte('\n')
	}
	golden := filepath.Join("testdata", "broken.golden")
	if *updateProblems {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("Load(testdata/broken) says:\n%s\nwant (%s):\n%s", b.String(), golden, want)
	}
	for i := 1; i < len(ps); i++ {
		a, b := ps[i-1], ps[i]
		if a.File > b.File || a.File == b.File && a.Line > b.Line {
			t.Errorf("problems not sorted by file, then line: %s before %s", a, b)
		}
	}
}

func TestParse(t *testing.T) {
	m, ps := Parse("x.yaml", []byte("module: x\nemits: [done]\n"))
	if len(ps) != 0 || m == nil || m.Module != "x" || m.File != "x.yaml" {
		t.Errorf("Parse = %+v, %v", m, ps)
	}
	m, ps = Parse("y.yaml", []byte("module: y\nemit: [done]\n"))
	if len(ps) != 1 || ps[0].Line != 2 || ps[0].Field != "emit" || m == nil || m.Module != "y" {
		t.Errorf("Parse with an unknown key = %+v, %v", m, ps)
	}
	m, ps = Parse("z.yaml", []byte("module: [z\n"))
	if len(ps) != 1 || m != nil {
		t.Errorf("Parse of malformed YAML = %+v, %v", m, ps)
	}
}

// decodeCorpus is manifests whose decoding the two decoders must agree on.
var decodeCorpus = []string{
	agentYAML,
	shopYAML,
	"module: x\nstate:\n  - {name: a, history: 1, ttl: 0}\n  - {name: b, history: ~, ttl: 7d}\n",
	"module: x\nbuild: ~\nemits: []\nserves: ~\n",
	"module: 123\nholds: [1, 2]\n",
	"module: \"x\"\nemits: ['a.b', \"c.*\"]\n",
	"module: x # a comment\nuses:\n  # about it\n  - node-build-agent\n",
	"module: x\nbuild:\n  repo: r\n  on: [\n    a,\n    b,\n  ]\n",
	"module: x\nemits: &e [done]\nseats:\n  - {seat: s, scope: node, emits: *e}\n",
	"module: x\nstate:\n  - name: a\n    history: 18446744073709551615\n",
	"module: x\nemits: [true, 1.5, null]\n",
	"module: x\nseats: [~]\n",
	"module: !!str x\n",
	"module: |\n  x\n",
	"module: x\nunknown: [1]\nbuild: {repo: r, extra: 1}\n",
}

// TestDecodePlainAgrees keeps decodePlain equal to goccy's decoder wherever
// it decodes at all.
func TestDecodePlainAgrees(t *testing.T) {
	corpus := append([]string(nil), decodeCorpus...)
	for _, dir := range []string{filepath.Join("..", "examples", "fleet", "catalogue"), filepath.Join("testdata", "clean"), filepath.Join("testdata", "broken")} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.y*ml"))
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			corpus = append(corpus, string(data))
		}
	}
	for _, m := range benchCatalogue(6000)[4990:5020] {
		data, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		corpus = append(corpus, string(data))
	}
	plain := 0
	for _, src := range corpus {
		if checkDecodeAgrees(t, src) {
			plain++
		}
	}
	if plain < len(corpus)*3/4 {
		t.Errorf("decodePlain decoded %d of %d manifests", plain, len(corpus))
	}
}

func FuzzDecodePlain(f *testing.F) {
	for _, s := range decodeCorpus {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) { checkDecodeAgrees(t, src) })
}

func checkDecodeAgrees(t *testing.T, src string) bool {
	t.Helper()
	file, err := parser.ParseBytes([]byte(src), 0)
	if err != nil || len(file.Docs) == 0 || file.Docs[0].Body == nil {
		return false
	}
	body := file.Docs[0].Body
	var fast Manifest
	if !decodePlain(body, &fast) {
		return false
	}
	var slow Manifest
	if err := yaml.NodeToValue(body, &slow); err != nil {
		t.Errorf("decodePlain decoded what goccy refuses (%v):\n%s", err, src)
		return true
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Errorf("decoders disagree on:\n%s\ndecodePlain: %#v\ngoccy:       %#v", src, fast, slow)
	}
	return true
}

// A catalogue of image modules works as it is: the farm's own modules (the
// build agent, the controller, the git bridge) are added, each with a
// warning that names it; a catalogue that declares its own keeps it.
func TestLoadAddsTheFarmsOwnModules(t *testing.T) {
	c, ps, err := Load("testdata/clean")
	if err != nil {
		t.Fatal(err)
	}
	if HasErrors(ps) {
		t.Fatalf("problems: %v", ps)
	}
	added := map[string]bool{}
	for _, p := range ps {
		if p.Warning && strings.HasPrefix(p.File, "(farm)/") {
			added[strings.TrimSuffix(strings.TrimPrefix(p.File, "(farm)/"), ".yaml")] = true
		}
	}
	for _, m := range []string{"build-agent", "build-controller", "git"} {
		if _, in := c.Module(m); !added[m] || !in {
			t.Errorf("%s: added %v, in the catalogue %v; want it added and said so", m, added[m], in)
		}
	}
	if len(c.Holders(ControllerSeat)) != 1 || len(c.Holders(BuildSeat)) != 1 {
		t.Errorf("the farm's roles are not filled: controller %d, agent %d", len(c.Holders(ControllerSeat)), len(c.Holders(BuildSeat)))
	}
	// The example fleet declares its own: nothing is added.
	_, ps, err = Load("../examples/fleet/catalogue")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if strings.HasPrefix(p.File, "(farm)/") {
			t.Errorf("added to a catalogue that has its own: %s", p)
		}
	}
}
