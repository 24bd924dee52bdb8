package mesh

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// agentYAML declares the build seat; cases that consume or use it include it.
const agentYAML = `module: build-agent
seats:
  - seat: node-build-agent
    scope: node
    accepts: [build retain 7d]
    emits: [started, built, failed, log.*]
    serves: [status]
`

const shopYAML = `module: shop
emits: [order.placed, order.paid, rotated]
state:
  - {name: orders, history: 5, ttl: 7d}
`

// want is one problem a case expects: the file (relative to the catalogue),
// the field, a part of the message, and optionally the line.
type want struct {
	file    string
	field   string
	text    string
	warning bool
	line    int
}

type checkCase struct {
	name  string
	files map[string]string
	want  []want
}

func runCheckCases(t *testing.T, cases []checkCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFiles(t, tc.files)
			_, ps, err := loadOwn(t, dir)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			assertProblems(t, dir, ps, tc.want)
		})
	}
}

// assertProblems checks that ps holds exactly the wanted problems.
func assertProblems(t *testing.T, dir string, ps []Problem, wants []want) {
	t.Helper()
	used := make([]bool, len(ps))
	for _, w := range wants {
		file := filepath.Join(dir, w.file)
		found := false
		for i, p := range ps {
			if used[i] || p.File != file || p.Field != w.field || p.Warning != w.warning ||
				!strings.Contains(p.Message, w.text) || w.line != 0 && p.Line != w.line {
				continue
			}
			used[i], found = true, true
			break
		}
		if !found {
			t.Errorf("want a problem in %s, field %q, warning %v, line %d, saying %q", w.file, w.field, w.warning, w.line, w.text)
		}
	}
	for i, p := range ps {
		if !used[i] {
			t.Errorf("unexpected problem: %s", p)
		}
	}
}

func TestCheckNames(t *testing.T) {
	runCheckCases(t, []checkCase{{
		name:  "module missing",
		files: map[string]string{"x.yaml": "emits: [done]\n"},
		want:  []want{{file: "x.yaml", field: "module", text: "write `module: NAME`"}},
	}, {
		name:  "module not a name",
		files: map[string]string{"x.yaml": "module: Build_Agent\n"},
		want:  []want{{file: "x.yaml", field: "module", text: `such as "build-agent"`, line: 1}},
	}, {
		name: "seat, verb, tool and bucket not names",
		files: map[string]string{"x.yaml": `module: x
seats:
  - seat: Node_Agent
    scope: node
    accepts: [Build]
    serves: [get_status]
serves: ["two words"]
state:
  - name: my_plans
`},
		want: []want{
			{file: "x.yaml", field: "seats[0].seat", text: `such as "node-agent"`, line: 3},
			{file: "x.yaml", field: "seats[0].accepts[0]", text: `"Build" is not a verb`, line: 5},
			{file: "x.yaml", field: "seats[0].serves[0]", text: `such as "get-status"`},
			{file: "x.yaml", field: "serves[0]", text: `such as "two-words"`},
			{file: "x.yaml", field: "state[0].name", text: `such as "my-plans"`, line: 9},
		},
	}, {
		name: "events not event names",
		files: map[string]string{"x.yaml": `module: x
emits: [Order.Placed, "a..b", "**"]
seats:
  - seat: s
    scope: node
    emits: [log.**.x]
`},
		want: []want{
			{file: "x.yaml", field: "emits[0]", text: `such as "order.placed"`},
			{file: "x.yaml", field: "emits[1]", text: "not an event name"},
			{file: "x.yaml", field: "emits[2]", text: "not an event name"},
			{file: "x.yaml", field: "seats[0].emits[0]", text: "not an event name"},
		},
	}, {
		name:  "event prefixed with the module's own name",
		files: map[string]string{"shop.yaml": "module: shop\nemits: [shop.order.placed]\n"},
		want:  []want{{file: "shop.yaml", field: "emits[0]", text: `write "order.placed"`, line: 2}},
	}, {
		name: "seat event prefixed with the seat's or module's name",
		files: map[string]string{"x.yaml": `module: x
seats:
  - seat: s
    scope: node
    emits: [s.done, x.started]
`},
		want: []want{
			{file: "x.yaml", field: "seats[0].emits[0]", text: `write "done"`},
			{file: "x.yaml", field: "seats[0].emits[1]", text: `write "started"`},
		},
	}, {
		name: "emitted event reads as another module's",
		files: map[string]string{
			"shop.yaml":    shopYAML,
			"billing.yaml": "module: billing\nemits: [shop.order.paid, paid]\n",
		},
		want: []want{{file: "billing.yaml", field: "emits[0]", text: "declare a seat that emits it, or emit a local name"}},
	}, {
		name: "emitted event reads as a seat's",
		files: map[string]string{
			"build-agent.yaml": agentYAML,
			"x.yaml":           "module: x\nemits: [node-build-agent.built, mesh-git.pushed]\n",
		},
		want: []want{
			{file: "x.yaml", field: "emits[0]", text: `list "built" under that seat's emits`},
			{file: "x.yaml", field: "emits[1]", text: "the mesh's seat mesh-git"},
		},
	}, {
		name: "log events are every emitter's own",
		files: map[string]string{
			"build-agent.yaml": agentYAML,
			"log.yaml":         "module: log\nemits: [rotated]\n",
			"x.yaml":           "module: x\nemits: [log.*]\nconsumes: [log.rotated, node-build-agent.log.*]\n",
		},
	}, {
		name: "duplicates in a list",
		files: map[string]string{"x.yaml": `module: x
emits: [a, a]
serves: [t, t]
holds: [mesh-git, mesh-git]
`},
		want: []want{
			{file: "x.yaml", field: "emits[1]", text: "listed twice (first as emits[0])"},
			{file: "x.yaml", field: "serves[1]", text: "listed twice"},
			{file: "x.yaml", field: "holds[1]", text: "listed twice"},
		},
	}})
}

func TestCheckMeshSeats(t *testing.T) {
	runCheckCases(t, []checkCase{{
		name: "a mesh seat declared under seats",
		files: map[string]string{"git.yaml": `module: git
seats:
  - seat: mesh-git
    scope: mesh
    emits: [pushed]
`},
		want: []want{{file: "git.yaml", field: "seats[0].seat", text: "to hold it write `holds: [mesh-git]`", line: 3}},
	}, {
		name: "a seat with the mesh- prefix",
		files: map[string]string{"x.yaml": `module: x
seats:
  - seat: mesh-cache
    scope: mesh
`},
		want: []want{{file: "x.yaml", field: "seats[0].seat", text: `"mesh-cache": the mesh-* prefix is the mesh's own`}},
	}, {
		name:  "holds a mesh seat that does not exist",
		files: map[string]string{"x.yaml": "module: x\nholds: [mesh-gti]\n"},
		want:  []want{{file: "x.yaml", field: "holds[0]", text: "its own seats are mesh-controller, mesh-git", line: 2}},
	}, {
		name: "holds a seat that is not the mesh's",
		files: map[string]string{
			"build-agent.yaml": agentYAML,
			"x.yaml":           "module: x\nholds: [node-build-agent]\n",
		},
		want: []want{{file: "x.yaml", field: "holds[0]", text: "declare the module's own seat under seats"}},
	}, {
		name:  "a module named as a mesh seat",
		files: map[string]string{"mesh-git.yaml": "module: mesh-git\n"},
		want:  []want{{file: "mesh-git.yaml", field: "module", text: "rename the module"}},
	}, {
		name: "a seat named as a module",
		files: map[string]string{
			"shop.yaml": shopYAML,
			"x.yaml":    "module: x\nseats:\n  - {seat: shop, scope: node}\n",
		},
		want: []want{{file: "x.yaml", field: "seats[0].seat", text: "rename the seat"}},
	}})
}

func TestCheckSeats(t *testing.T) {
	runCheckCases(t, []checkCase{{
		name: "reserved tokens",
		files: map[string]string{"x.yaml": `module: x
emits: [mod]
serves: [tool]
seats:
  - seat: s
    scope: node
    accepts: [event, accept retain 1d]
    emits: [seat]
    serves: [mesh]
`},
		want: []want{
			{file: "x.yaml", field: "emits[0]", text: "derivation's own tokens"},
			{file: "x.yaml", field: "serves[0]", text: "derivation's own tokens"},
			{file: "x.yaml", field: "seats[0].accepts[0]", text: `such as "event-verb"`},
			{file: "x.yaml", field: "seats[0].accepts[1]", text: "derivation's own tokens"},
			{file: "x.yaml", field: "seats[0].emits[0]", text: "derivation's own tokens"},
			{file: "x.yaml", field: "seats[0].serves[0]", text: "derivation's own tokens"},
		},
	}, {
		name: "accepts malformed",
		files: map[string]string{"x.yaml": `module: x
seats:
  - seat: s
    scope: node
    accepts:
      - build keep 7d
      - build retain soon
      - deploy retain 0
      - test retain 2w
      - lint retain 36h
      - test
`},
		want: []want{
			{file: "x.yaml", field: "seats[0].accepts[0]", text: "write VERB or VERB retain DURATION", line: 6},
			{file: "x.yaml", field: "seats[0].accepts[1]", text: "not a duration", line: 7},
			{file: "x.yaml", field: "seats[0].accepts[2]", text: "retain 0", line: 8},
			{file: "x.yaml", field: "seats[0].accepts[5]", text: `verb "test" is accepted twice`, line: 11},
		},
	}, {
		name: "scope",
		files: map[string]string{"x.yaml": `module: x
seats:
  - seat: a
  - seat: b
    scope: cluster
`},
		want: []want{
			{file: "x.yaml", field: "seats[0].scope", text: "write `scope: node` or `scope: mesh`", line: 3},
			{file: "x.yaml", field: "seats[1].scope", text: `"cluster" is not a scope`, line: 5},
		},
	}, {
		name: "seat missing or twice in one manifest",
		files: map[string]string{"x.yaml": `module: x
seats:
  - scope: node
  - {seat: s, scope: node}
  - {seat: s, scope: mesh}
`},
		want: []want{
			{file: "x.yaml", field: "seats[0].seat", text: "write `seat: NAME`"},
			{file: "x.yaml", field: "seats[2].seat", text: "declared twice in this manifest"},
		},
	}, {
		name: "shards on a seat that does not split, or too many",
		files: map[string]string{"x.yaml": `module: x
seats:
  - {seat: shop, scope: node, shards: 4}
`, "agent.yaml": `module: agent
seats:
  - {seat: node-build-agent, scope: node, accepts: [build], shards: 65}
`},
		want: []want{
			{file: "x.yaml", field: "seats[0].shards", text: "only the build seat (node-build-agent) splits its queue into shards: remove `shards`", line: 3},
			{file: "agent.yaml", field: "seats[0].shards", text: "shards 65: write 1 to 64", line: 3},
		},
	}})
}

func TestCheckState(t *testing.T) {
	runCheckCases(t, []checkCase{{
		name: "buckets",
		files: map[string]string{"x.yaml": `module: x
state:
  - {name: a, history: 65}
  - {name: b, history: -1}
  - {name: c, ttl: forever}
  - {name: c}
  - {history: 1}
  - {name: d, history: 64, ttl: 0}
  - {name: e, ttl: 2w}
  - {name: f, ttl: 90s}
`},
		want: []want{
			{file: "x.yaml", field: "state[0].history", text: "write 1 to 64"},
			{file: "x.yaml", field: "state[1].history", text: "write 1 to 64"},
			{file: "x.yaml", field: "state[2].ttl", text: "not a duration"},
			{file: "x.yaml", field: "state[3].name", text: "declared twice (first as state[2])"},
			{file: "x.yaml", field: "state[4].name", text: "write `name: BUCKET`"},
		},
	}, {
		name: "reads a bucket its owner does not declare",
		files: map[string]string{
			"shop.yaml": shopYAML,
			"x.yaml":    "module: x\nreads: [shop.orders, shop.carts, absent.anything]\n",
		},
		want: []want{{file: "x.yaml", field: "reads[1]", text: `no bucket "carts"; its state is orders`, line: 2}},
	}, {
		name:  "reads malformed",
		files: map[string]string{"x.yaml": "module: x\nreads: [plans, Shop.orders, shop.Orders, shop.a.b]\n"},
		want: []want{
			{file: "x.yaml", field: "reads[0]", text: "not <module>.<bucket>"},
			{file: "x.yaml", field: "reads[1]", text: `such as "shop"`},
			{file: "x.yaml", field: "reads[2]", text: `such as "orders"`},
			{file: "x.yaml", field: "reads[3]", text: "not <module>.<bucket>"},
		},
	}})
}

func TestCheckWire(t *testing.T) {
	runCheckCases(t, []checkCase{{
		name: "wire spellings",
		files: map[string]string{"x.yaml": `module: x
consumes:
  - mesh.mod.shop.event.order.placed
  - mesh.seat.node-build-agent.event.log.>
  - shop.order.#
emits: [log.>]
uses: [mesh.seat.node-build-agent.accept.>]
reads: [$KV.shop_orders.>]
serves: [_INBOX.abc]
holds: [$JS.API.STREAM.INFO]
seats:
  - seat: s
    scope: node
    accepts: [mesh.seat.s.accept.build]
state:
  - {name: b, ttl: "mesh.x"}
build:
  repo: mesh.x.y
  path: $JS.z
  on: [mesh.mod.base]
  platforms: ["linux/>"]
`},
		want: []want{
			{file: "x.yaml", field: "consumes[0]", text: `write "shop.order.placed"`, line: 3},
			{file: "x.yaml", field: "consumes[1]", text: `write "node-build-agent.log.**"`, line: 4},
			{file: "x.yaml", field: "consumes[2]", text: `write "shop.order.**"`},
			{file: "x.yaml", field: "emits[0]", text: `write "log.**"`},
			{file: "x.yaml", field: "uses[0]", text: `write "node-build-agent"`},
			{file: "x.yaml", field: "reads[0]", text: `write "shop.orders"`},
			{file: "x.yaml", field: "serves[0]", text: "names are local"},
			{file: "x.yaml", field: "holds[0]", text: "names are local"},
			{file: "x.yaml", field: "seats[0].accepts[0]", text: `write "build"`},
			{file: "x.yaml", field: "state[0].ttl", text: "names are local"},
			{file: "x.yaml", field: "build.repo", text: "reads as a subject on the wire"},
			{file: "x.yaml", field: "build.path", text: "reads as a subject on the wire"},
			{file: "x.yaml", field: "build.on[0]", text: "names are local"},
			{file: "x.yaml", field: "build.platforms[0]", text: "not a platform"},
		},
	}, {
		name: "a URL may hold '#' and '>'",
		files: map[string]string{"x.yaml": `module: x
build:
  repo: "https://git.example/x.git#main>"
`},
	}})
}

func TestCheckBuild(t *testing.T) {
	runCheckCases(t, []checkCase{{
		// A module built for a platform its base is not built for (nor for
		// one a machine of it runs): a warning naming both, the platforms
		// and the fix. Seen by hand: tool for linux/386 on runtime
		// (linux/amd64) built an image that says 386 and holds runtime's
		// amd64 programs, without a word.
		name: "base platforms",
		files: map[string]string{
			"runtime.yaml": "module: runtime\nbuild: {repo: r}\n",
			"multi.yaml":   "module: multi\nbuild: {repo: r, platforms: [linux/amd64, linux/arm64]}\n",
			"i386.yaml":    "module: i386\nbuild: {repo: r, platforms: [linux/386]}\n",
			"tool.yaml":    "module: tool\nbuild:\n  repo: r\n  on: [runtime]\n  platforms: [linux/amd64, linux/386]\n",
			"app.yaml":     "module: app\nbuild: {repo: r, on: [runtime, multi]}\n",
			"lib.yaml":     "module: lib\nbuild: {repo: r, on: [multi], platforms: [linux/arm64]}\n",
			"old.yaml":     "module: old\nbuild: {repo: r, on: [i386]}\n",
			"arm.yaml":     "module: arm\nbuild: {repo: r, on: [lib, multi], platforms: [linux/arm/v7, linux/arm64]}\n",
		},
		want: []want{
			{file: "tool.yaml", field: "build.on[0]", warning: true, line: 4,
				text: "runtime.yaml) only for linux/amd64: tool's linux/386 image would be built FROM runtime's linux/amd64 image, whose programs it cannot run " +
					"(BuildKit does not check a base's platform): add linux/386 to runtime's build.platforms, or leave it so if runtime carries only files"},
			{file: "arm.yaml", field: "build.on[0]", warning: true, text: "arm is built for linux/arm/v7, its base lib ("},
			{file: "arm.yaml", field: "build.on[1]", warning: true, text: "arm is built for linux/arm/v7, its base multi ("},
		},
	}, {
		name: "fields",
		files: map[string]string{
			"base.yaml": "module: base\nbuild: {repo: r}\n",
			"x.yaml": `module: x
build:
  path: /src/x
  dockerfile: /Dockerfile
  on: [Base, base, base, x]
  platforms: [amd64, linux/arm64/v8, linux/amd64, linux/amd64]
`,
			"y.yaml": `module: y
build:
  repo: r
  path: ../y
  dockerfile: ../../Dockerfile
`,
			"z.yaml": `module: z
build:
  repo: r
  path: a/b
  dockerfile: ../../docker/Dockerfile
`,
			"c.yaml": "module: c\nbuild:\n  repo: r\n  compression: xz\n",
			"d.yaml": "module: d\nbuild:\n  repo: r\n  compression: zstd\n",
		},
		want: []want{
			{file: "x.yaml", field: "build.repo", text: "write `repo:`", line: 2},
			{file: "x.yaml", field: "build.path", text: `such as "src/x"`, line: 3},
			{file: "x.yaml", field: "build.dockerfile", text: "not a relative path"},
			{file: "x.yaml", field: "build.on[0]", text: `such as "base"`},
			{file: "x.yaml", field: "build.on[1]", text: "x is built for linux/arm64/v8, its base base", warning: true},
			{file: "x.yaml", field: "build.on[2]", text: "listed twice"},
			{file: "x.yaml", field: "build.on[3]", text: "not built FROM its own image"},
			{file: "x.yaml", field: "build.platforms[0]", text: "write os/arch"},
			{file: "x.yaml", field: "build.platforms[3]", text: "listed twice"},
			{file: "y.yaml", field: "build.path", text: "leaves the repository"},
			{file: "y.yaml", field: "build.dockerfile", text: "leaves the repository"},
			{file: "c.yaml", field: "build.compression", text: `"xz" is not a layer compression: write gzip (the default) or zstd`, line: 4},
		},
	}, {
		name: "build.on a module that is missing or has no build",
		files: map[string]string{
			"base.yaml": "module: base\n",
			"x.yaml":    "module: x\nbuild:\n  repo: r\n  on: [base, runtime]\n",
		},
		want: []want{
			{file: "x.yaml", field: "build.on[0]", text: "has no build, so no image to be built FROM", line: 4},
			{file: "x.yaml", field: "build.on[1]", text: `no module "runtime" in the catalogue`},
		},
	}, {
		name: "a cycle",
		files: map[string]string{
			"a.yaml": "module: a\nbuild: {repo: r, on: [base, b]}\n",
			"b.yaml": "module: b\nbuild: {repo: r, on: [c]}\n",
			"c.yaml": "module: c\nbuild: {repo: r, on: [a]}\n",
			"d.yaml": "module: d\nbuild: {repo: r, on: [a]}\n",
			// base is built FROM nothing; nothing refers to d.
			"base.yaml": "module: base\nbuild: {repo: r}\n",
		},
		want: []want{{file: "a.yaml", field: "build.on[1]", text: "build.on forms a cycle: a → b → c → a;", line: 2}},
	}, {
		name: "two cycles, printed from their first module",
		files: map[string]string{
			"q.yaml": "module: q\nbuild: {repo: r, on: [p]}\n",
			"p.yaml": "module: p\nbuild: {repo: r, on: [q]}\n",
			"z.yaml": "module: z\nbuild: {repo: r, on: [y]}\n",
			"y.yaml": "module: y\nbuild: {repo: r, on: [x]}\n",
			"x.yaml": "module: x\nbuild: {repo: r, on: [z, y]}\n",
		},
		want: []want{
			{file: "p.yaml", field: "build.on[0]", text: "cycle: p → q → p;"},
			{file: "x.yaml", field: "build.on[1]", text: "cycle: x → y → x;"},
		},
	}})
}

func TestCheckReferences(t *testing.T) {
	runCheckCases(t, []checkCase{{
		name: "consumes an event its emitter does not emit",
		files: map[string]string{
			"build-agent.yaml": agentYAML,
			"shop.yaml":        shopYAML,
			"x.yaml": `module: x
consumes:
  - node-build-agent.done
  - mesh-git.pulled
  - shop.order.shipped
  - shop.*
  - build-agent.built
`,
		},
		want: []want{
			{file: "x.yaml", field: "consumes[0]", text: "it emits started, built, failed, log.*", line: 3},
			{file: "x.yaml", field: "consumes[1]", text: `the mesh's seat mesh-git does not emit "pulled"; it emits pushed`},
			{file: "x.yaml", field: "consumes[2]", text: "it emits order.placed, order.paid, rotated"},
			{file: "x.yaml", field: "consumes[4]", text: `its seat node-build-agent does: write "node-build-agent.built"`},
		},
	}, {
		name: "consumes matching with wildcards, and absent emitters",
		files: map[string]string{
			"build-agent.yaml": agentYAML,
			"shop.yaml":        shopYAML,
			"x.yaml": `module: x
consumes:
  - node-build-agent.log.*
  - node-build-agent.log.a1b2
  - node-build-agent.*
  - node-build-agent.**
  - shop.order.*
  - shop.*.paid
  - shop.**
  - mesh-git.pushed
  - not-installed-yet.anything
`,
		},
	}, {
		name:  "consumes malformed",
		files: map[string]string{"x.yaml": "module: x\nconsumes: [pushed, Git.pushed, git.Pushed, git.pushed, git.pushed]\n"},
		want: []want{
			{file: "x.yaml", field: "consumes[0]", text: "not <emitter>.<event>"},
			{file: "x.yaml", field: "consumes[1]", text: `such as "git"`},
			{file: "x.yaml", field: "consumes[2]", text: "not an event name"},
			{file: "x.yaml", field: "consumes[4]", text: "listed twice"},
		},
	}, {
		name: "uses",
		files: map[string]string{
			"build-agent.yaml": agentYAML,
			"shop.yaml":        shopYAML,
			"x.yaml":           "module: x\nuses: [node-build-agent, mesh-controller, node-deploy-agent, shop, Bad]\n",
		},
		want: []want{
			{file: "x.yaml", field: "uses[2]", text: "work submitted to it queues until then", warning: true, line: 2},
			{file: "x.yaml", field: "uses[3]", text: "is a module"},
			{file: "x.yaml", field: "uses[4]", text: "not a seat name"},
		},
	}, {
		name: "the same module twice",
		files: map[string]string{
			"a.yaml": "module: shop\n",
			"b.yaml": "module: shop\n",
		},
		want: []want{{file: "b.yaml", field: "module", text: "already declared in ", line: 1}},
	}, {
		name: "a manifest that cannot be decoded is not reported missing again",
		files: map[string]string{
			"base.yaml":    "module: base\nbuild: {repo: r\n",
			"runtime.yaml": "module: runtime\nbuild: {repo: r, on: [base]}\n",
			"shop.yaml":    "module: shop\nstate:\n  - {name: orders, history: lots}\n",
			"x.yaml":       "module: x\nreads: [shop.orders]\nconsumes: [shop.anything]\n",
		},
		want: []want{
			{file: "base.yaml", text: "flow mapping end token", line: 2},
			{file: "shop.yaml", field: "state[0].history", text: `cannot read "lots" as a whole number`, line: 3},
		},
	}})
}

// TestCheckNamesOtherFiles checks the messages that name another file, which
// lives in the test's temporary directory.
func TestCheckNamesOtherFiles(t *testing.T) {
	files := map[string]string{
		"build-agent.yaml": agentYAML,
		"other-agent.yaml": "module: other-agent\nseats:\n  - {seat: node-build-agent, scope: node}\n",
		"a.yaml":           "module: shop\n",
		"b.yaml":           "module: shop\n",
		"base.yaml":        "module: base\n",
		"x.yaml":           "module: x\nbuild:\n  repo: r\n  on: [base]\n",
	}
	dir := writeFiles(t, files)
	_, ps, err := loadOwn(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	assertProblems(t, dir, ps, []want{
		{file: "other-agent.yaml", field: "seats[0].seat", text: "already declared by module build-agent (" + filepath.Join(dir, "build-agent.yaml") + ")", line: 3},
		{file: "b.yaml", field: "module", text: "already declared in " + filepath.Join(dir, "a.yaml")},
		{file: "x.yaml", field: "build.on[0]", text: "module base (" + filepath.Join(dir, "base.yaml") + ") has no build"},
	})
}

func TestCheckInMemory(t *testing.T) {
	ms := []*Manifest{
		{Module: "a", Build: &Build{Repo: "r", On: []string{"b"}}},
		{Module: "b", Build: &Build{Repo: "r", On: []string{"a"}}},
		{Module: "c", Consumes: []string{"mesh-git.pulled"}, Uses: []string{"nobody"}},
		{Module: "a"},
	}
	ps := Check(ms)
	want := []string{
		`module: module "a" is already declared in an earlier manifest: a module is declared by one manifest; remove this file or rename the module`,
		`consumes[0]: the mesh's seat mesh-git does not emit "pulled"; it emits pushed: consume one of those, or declare the event in the seat's emits`,
		`uses[0]: no module in the catalogue declares seat "nobody": if its holder comes later, work submitted to it queues until then; otherwise check the name`,
		"build.on[0]: build.on forms a cycle: a → b → a; an image cannot be built FROM an image built FROM it: remove one of these build.on entries",
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Check:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !HasErrors(ps) {
		t.Error("HasErrors = false")
	}
	if HasErrors([]Problem{{Warning: true}}) || HasErrors(nil) {
		t.Error("HasErrors(warnings only) = true")
	}
	if ps := Check(nil); len(ps) != 0 {
		t.Errorf("Check(nil) = %v", ps)
	}
}

func TestOverlaps(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"built", "built", true},
		{"built", "failed", false},
		{"log.*", "log.*", true},
		{"log.*", "log.abc", true},
		{"log.abc", "log.*", true},
		{"*", "started", true},
		{"*", "log.*", false},
		{"*", "log.abc", false},
		{"**", "log.abc", true},
		{"log.**", "log.a.b.c", true},
		{"log.**", "log", false},
		{"log", "log.*", false},
		{"order.*.paid", "order.x.paid", true},
		{"order.*.paid", "order.x.placed", false},
		{"a.b", "a.b.c", false},
		{"*.*", "a.**", true},
	} {
		if got := overlaps(tc.a, tc.b); got != tc.want {
			t.Errorf("overlaps(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := overlaps(tc.b, tc.a); got != tc.want {
			t.Errorf("overlaps(%q, %q) = %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestProblemString(t *testing.T) {
	for _, tc := range []struct {
		p    Problem
		want string
	}{
		{Problem{File: "a.yaml", Line: 3, Field: "consumes[0]", Message: "m"}, "a.yaml:3: consumes[0]: m"},
		{Problem{File: "a.yaml", Field: "module", Message: "m"}, "a.yaml: module: m"},
		{Problem{File: "a.yaml", Line: 1, Message: "m"}, "a.yaml:1: m"},
		{Problem{Field: "uses[0]", Message: "m", Warning: true}, "uses[0]: m"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
	b, err := json.Marshal(Problem{File: "a.yaml", Line: 2, Field: "f", Message: "m", Warning: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"file":"a.yaml","line":2,"field":"f","message":"m","warning":true}`; string(b) != want {
		t.Errorf("json = %s, want %s", b, want)
	}
}

var grammarCorpus = []string{
	"", "a", "a-b", "a--b", "-a", "a-", "A", "a_b", "a.b", "a.*", "*", "**", "a.**", "*.**",
	"a.**.b", "a..b", ".a", "a.", "log.*", "order.placed", "x-1.y-2.*", "é", "a b", "a.-b",
	"0", "9-9", "a.*.**", "**.a", "a.>", "a.#", "mesh-git", "a.b.c.d.e", "*.*", "a-.b",
}

// TestGrammarAgrees keeps the checks' fast isName and isEvent equal to the
// grammar's ValidName and ValidEvent.
func TestGrammarAgrees(t *testing.T) {
	for _, s := range grammarCorpus {
		if isName(s) != ValidName(s) {
			t.Errorf("isName(%q) = %v, ValidName says %v", s, isName(s), ValidName(s))
		}
		if isEvent(s) != ValidEvent(s) {
			t.Errorf("isEvent(%q) = %v, ValidEvent says %v", s, isEvent(s), ValidEvent(s))
		}
	}
}

func FuzzGrammar(f *testing.F) {
	for _, s := range grammarCorpus {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if isName(s) != ValidName(s) || isEvent(s) != ValidEvent(s) {
			t.Errorf("%q: isName %v ValidName %v isEvent %v ValidEvent %v", s, isName(s), ValidName(s), isEvent(s), ValidEvent(s))
		}
	})
}

// loadOwn loads the manifests in dir as Load does, without the farm's own
// modules: the checks are about what the files say.
func loadOwn(t *testing.T, dir string) (*Catalogue, []Problem, error) {
	t.Helper()
	var files []string
	for _, ext := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(dir, ext))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	return LoadFiles(files)
}
