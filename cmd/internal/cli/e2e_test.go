package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

const fleetRepo = "https://git.example/e2e.git"

// e2eCatalogue writes the mesh's modules (from examples/fleet) and a
// base → three dependents → one grand-dependent graph.
func e2eCatalogue(t *testing.T) string {
	t.Helper()
	dir := meshCatalogue(t)
	built := map[string]string{"base": "", "d1": "[base]", "d2": "[base]", "d3": "[base]", "g": "[d1, d2]"}
	for m, on := range built {
		y := "module: " + m + "\nbuild:\n  repo: " + fleetRepo + "\n  path: " + m + "\n"
		if on != "" {
			y += "  on: " + on + "\n"
		}
		if err := os.WriteFile(filepath.Join(dir, m+".yaml"), []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func e2eSources(t *testing.T) map[string]string {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox-static: %v (run scripts/install-deps.sh)", err)
	}
	files := map[string]string{
		"base/busybox":    string(bb),
		"base/Dockerfile": "FROM scratch\nCOPY --chmod=755 busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nENV PATH=/bin\n",
		"g/Dockerfile":    "FROM d2 AS other\nFROM d1\nCOPY --from=other /d2.txt /d2.txt\nRUN cat /d1.txt /d2.txt > /g.txt\n",
	}
	for _, d := range []string{"d1", "d2", "d3"} {
		files[d+"/Dockerfile"] = "FROM base\nRUN echo " + d + " > /" + d + ".txt && sleep 1\n"
	}
	return files
}

func layers(t *testing.T, ref string) []v1.Hash {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("reading %s: %v", ref, err)
	}
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []v1.Hash
	for _, l := range ls {
		d, _ := l.Digest()
		out = append(out, d)
	}
	return out
}

func hasPrefix(all, prefix []v1.Hash) bool {
	if len(prefix) > len(all) {
		return false
	}
	for i := range prefix {
		if all[i] != prefix[i] {
			return false
		}
	}
	return true
}

// TestACascadeBuiltByRealAgents: a push of base builds base, then its three
// dependents on two machines, then the grand-dependent on two of them, each
// FROM the digest its base just pushed; `builds show --json` lists both
// machines.
func TestACascadeBuiltByRealAgents(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	s := natstest.Server(t, nil)
	catDir := e2eCatalogue(t)
	gitDir, _ := testenv.GitRepo(t, e2eSources(t))
	commit := testenv.Commit(t, gitDir, map[string]string{"base/VERSION": "2\n"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3)
	// The controller as build-controller runs it: its defaults (the idle
	// window), the registry given.
	startController(t, ctx, registryController(s, catDir, reg), errs)
	for _, m := range []string{"e2e-a", "e2e-b"} {
		cfg := agent.DefaultConfig()
		cfg.Machine = m
		runFleetAgent(t, ctx, s, cfg, bk, gitDir, nil, errs)
	}

	view := pushWatch(t, ctx, s.ClientURL(), commit)
	var out, errw bytes.Buffer
	if view.Plan.Outcome != cascade.OutcomeBuilt || len(view.Modules) != 5 {
		t.Fatalf("plan %+v with %d modules", view.Plan, len(view.Modules))
	}
	if len(view.Machines) != 2 {
		t.Errorf("machines %v: want both agents", view.Machines)
	}
	by := map[string]cascade.ModuleStatus{}
	for _, m := range view.Modules {
		by[m.Module] = m
		if !strings.HasSuffix(m.Image, "@"+m.Digest) || m.Digest == "" {
			t.Errorf("%s: image %q digest %q", m.Module, m.Image, m.Digest)
		}
	}
	// Each image is built FROM the digest its base just pushed: its base's
	// layers are its first layers.
	base := layers(t, by["base"].Image)
	for _, d := range []string{"d1", "d2", "d3"} {
		if l := layers(t, by[d].Image); !hasPrefix(l, base) || len(l) != len(base)+1 {
			t.Errorf("%s layers %v do not start with base's %v", d, l, base)
		}
	}
	if g := layers(t, by["g"].Image); !hasPrefix(g, layers(t, by["d1"].Image)) {
		t.Errorf("g is not built on d1's pushed digest")
	}
	// show --json agrees.
	out.Reset()
	if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "--json", "show", view.Plan.ID}, &out, &errw); code != 0 {
		t.Fatalf("show: %s", errw.String())
	}
	var shown cli.PlanView
	if err := json.Unmarshal(out.Bytes(), &shown); err != nil || len(shown.Machines) != len(view.Machines) {
		t.Fatalf("show --json: %v %+v", err, shown.Machines)
	}
	// show --json names each image's attestations by digest: the pushed
	// index, its attestation manifest and the provenance in it (no SBOM:
	// no generator is configured).
	for _, m := range shown.Modules {
		a := m.Attestations
		if a == nil || !strings.HasPrefix(a.Index, "sha256:") || !strings.HasPrefix(a.Manifest, "sha256:") || !strings.HasPrefix(a.Provenance, "sha256:") || a.SBOM != "" || a.Index == m.Digest {
			t.Errorf("%s: attestations %+v, want the index, attestation manifest and provenance by digest", m.Module, a)
			continue
		}
		if got, err := registry.NewClient(registry.WithInsecure(true)).Resolve(ctx, strings.Split(m.Image, "@")[0]+"@"+a.Index); err != nil || got != a.Index {
			t.Errorf("%s: the index %s does not resolve: %s %v", m.Module, a.Index, got, err)
		}
	}
	// rebuild: d3 again, from the repository's HEAD, on the base's current
	// digest (base is outside this plan).
	out.Reset()
	if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "--json", "rebuild", "d3", "--watch"}, &out, &errw); code != 0 {
		t.Fatalf("rebuild d3: exit %d\n%s\n%s", code, out.String(), errw.String())
	}
	var rebuilt cli.PlanView
	if err := json.Unmarshal(out.Bytes(), &rebuilt); err != nil || len(rebuilt.Modules) != 1 {
		t.Fatalf("rebuild --json: %v %+v", err, rebuilt)
	}
	if m := rebuilt.Modules[0]; m.Commit != commit || !hasPrefix(layers(t, m.Image), base) {
		t.Errorf("rebuilt d3 at commit %s (want HEAD = %s), on base layers %v", m.Commit, commit, base)
	}

	// logs: the build output of a module, as BuildKit printed it.
	out.Reset()
	if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "logs", view.Plan.ID, "d1"}, &out, &errw); code != 0 {
		t.Fatalf("logs: %s", errw.String())
	}
	if !strings.Contains(out.String(), "echo d1") || !strings.Contains(out.String(), "exporting to image") {
		t.Errorf("logs of d1:\n%s", out.String())
	}
	// machines: both agents answer, with their counts.
	ms := machines(t, s.ClientURL())
	built := int64(0)
	for _, m := range ms {
		if !m.Online || m.Slots != 1 {
			t.Errorf("machine %+v: want online with 1 slot", m)
		}
		built += m.Built
	}
	if len(ms) != 2 || built != 6 {
		t.Errorf("machines %+v: want 2 machines that built 6 images (5, then d3 again)", ms)
	}
	cancel()
}
