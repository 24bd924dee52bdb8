package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/cli"
	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// TestAModuleOfTwoPlatformsIsBuiltOnAMachineOfEach: a module declared for
// linux/amd64 and linux/arm64 (FROM scratch, COPY: no emulation needed) is
// built on two agents, one declaring each platform (their BuildKit worker
// lists both); its built digest is an OCI index in the registry naming both
// manifests with their platforms; a dependent is pinned to the index.
func TestAModuleOfTwoPlatformsIsBuiltOnAMachineOfEach(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.BuildkitdWith(t, buildkitd.Options{RegistryHosts: []string{reg}, Platforms: []string{"linux/amd64", "linux/arm64"}})
	s := natstest.Server(t, nil)

	catDir := meshCatalogue(t)
	for m, y := range map[string]string{
		"multi": "module: multi\nbuild:\n  repo: " + fleetRepo + "\n  path: multi\n  platforms: [linux/amd64, linux/arm64]\n",
		"dep":   "module: dep\nbuild:\n  repo: " + fleetRepo + "\n  path: dep\n  on: [multi]\n",
	} {
		addModule(t, catDir, m, y)
	}
	gitDir, _ := testenv.GitRepo(t, map[string]string{
		"multi/Dockerfile": "FROM scratch\nCOPY hello.txt /hello.txt\n",
		"multi/hello.txt":  "hello\n",
		"dep/Dockerfile":   "FROM multi\nCOPY dep.txt /dep.txt\n",
		"dep/dep.txt":      "dep\n",
	})
	commit := testenv.Commit(t, gitDir, map[string]string{"multi/VERSION": "2\n"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3)
	startController(t, ctx, registryController(s, catDir, reg), errs)
	for m, p := range map[string]string{"amd": "linux/amd64", "arm": "linux/arm64"} {
		cfg := agent.DefaultConfig()
		cfg.Machine, cfg.Platforms = m, []string{p}
		runFleetAgent(t, ctx, s, cfg, bk, gitDir, nil, errs)
	}

	view := pushWatch(t, ctx, s.ClientURL(), commit)
	if view.Plan.Outcome != cascade.OutcomeBuilt {
		t.Fatalf("plan %+v: %+v", view.Plan, view.Modules)
	}
	by := map[string]cascade.ModuleStatus{}
	for _, m := range view.Modules {
		by[m.Module] = m
	}
	multi := by["multi"]
	if len(multi.Platforms) != 2 || multi.On != "amd,arm" {
		t.Fatalf("multi %+v: want two platforms built on amd and arm", multi)
	}
	for _, p := range multi.Platforms {
		want := map[string]string{"linux/amd64": "amd", "linux/arm64": "arm"}[p.Platform]
		if p.On != want || p.State != cascade.Built {
			t.Errorf("platform %+v: want built on %s", p, want)
		}
	}

	// The module's digest is an OCI index naming both manifests.
	ref, err := name.ParseReference(multi.Image, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatalf("reading the index %s: %v", multi.Image, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d.String() != multi.Digest || im.MediaType != ocispec.MediaTypeImageIndex {
		t.Errorf("index %s (%s), want digest %s", d, im.MediaType, multi.Digest)
	}
	var got []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			t.Fatalf("manifest %s has no platform", m.Digest)
		}
		got = append(got, m.Platform.OS+"/"+m.Platform.Architecture)
		i := slices.IndexFunc(multi.Platforms, func(p cascade.PlatformStatus) bool { return p.Digest == m.Digest.String() })
		if i < 0 || multi.Platforms[i].Platform != got[len(got)-1] {
			t.Errorf("index entry %s %s is not the built manifest of its platform", m.Digest, got[len(got)-1])
		}
	}
	if !slices.Equal(got, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("index platforms %v", got)
	}
	latest, err := name.ParseReference(reg+"/multi:latest", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	// The tag names BuildKit's layout: the same images, then each
	// platform's attestation manifest, the revision on the index; its
	// identity is the module's index.
	tagged, err := remote.Index(latest)
	if err != nil {
		t.Fatal(err)
	}
	tim, err := tagged.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tim.Manifests) != 4 || tim.Annotations[ocispec.AnnotationRevision] != commit {
		t.Errorf("multi:latest holds %d manifests, annotations %v: want 2 images and 2 attestation manifests, revision %s", len(tim.Manifests), tim.Annotations, commit)
	}
	for i, m := range tim.Manifests {
		if i < 2 {
			if m.Digest != im.Manifests[i].Digest {
				t.Errorf("multi:latest manifest %d is %s, want the image %s", i, m.Digest, im.Manifests[i].Digest)
			}
			continue
		}
		p := multi.Platforms[slices.IndexFunc(multi.Platforms, func(p cascade.PlatformStatus) bool { return p.Digest == im.Manifests[i-2].Digest.String() })]
		if m.Annotations["vnd.docker.reference.type"] != "attestation-manifest" || m.Annotations["vnd.docker.reference.digest"] != p.Digest ||
			p.Attestations == nil || m.Digest.String() != p.Attestations.Manifest {
			t.Errorf("multi:latest manifest %d %+v: want %s's attestation manifest %+v", i, m, p.Platform, p.Attestations)
		}
	}
	if id, err := registry.NewClient(registry.WithInsecure(true)).Identity(ctx, reg+"/multi:latest"); err != nil || id != multi.Digest {
		t.Errorf("identity of multi:latest is %s (%v), want the index %s", id, err, multi.Digest)
	}
	prov := testenv.ImagetoolsInspect(t, reg+"/multi:latest", "{{json .Provenance}}")
	var byPlatform map[string]json.RawMessage
	if err := json.Unmarshal([]byte(prov), &byPlatform); err != nil || byPlatform["linux/amd64"] == nil || byPlatform["linux/arm64"] == nil {
		t.Errorf("buildx imagetools inspect multi:latest: provenance %.300s (%v), want one for each platform", prov, err)
	}
	// The dependent was pinned to the index: it is built on the amd64
	// manifest's layer, which BuildKit picked from the index.
	dep := by["dep"]
	if dep.State != cascade.Built || dep.On != "amd" {
		t.Fatalf("dep %+v", dep)
	}
	amdManifest := multi.Platforms[slices.IndexFunc(multi.Platforms, func(p cascade.PlatformStatus) bool { return p.Platform == mesh.DefaultPlatform })]
	if l := layers(t, dep.Image); !hasPrefix(l, layers(t, reg+"/multi@"+amdManifest.Digest)) {
		t.Errorf("dep's layers %v are not built on multi's amd64 manifest", l)
	}

	// logs: each platform's output, from the machine that built it,
	// under a line naming the platform.
	var out, errw bytes.Buffer
	if code := cli.Main(ctx, []string{"--nats", s.ClientURL(), "logs", view.Plan.ID, "multi"}, &out, &errw); code != 0 {
		t.Fatalf("logs multi: %s", errw.String())
	}
	// The module is over: one platform's output after the other, each
	// whole (its build's steps and its timings).
	amd, arm, ok := strings.Cut(out.String(), "── linux/arm64, on arm ──\n")
	if !ok || !strings.HasPrefix(amd, "── linux/amd64, on amd ──\n") || strings.Contains(arm, "── linux/amd64") || errw.Len() > 0 {
		t.Fatalf("logs of multi: want linux/amd64's output, then linux/arm64's, each under one line naming it, nothing on stderr:\n%s\nstderr: %s", out.String(), errw.String())
	}
	for p, part := range map[string]string{"linux/amd64": amd, "linux/arm64": arm} {
		if !strings.Contains(part, "COPY hello.txt") || !strings.Contains(part, "buildcache-"+mesh.PlatformToken(p)) || !strings.Contains(part, "took: ") {
			t.Errorf("logs of multi: %s's part is not its whole build:\n%s", p, part)
		}
	}

	// machines: each agent lists the platform it builds.
	for _, m := range machines(t, s.ClientURL()) {
		want := map[string]string{"amd": "linux/amd64", "arm": "linux/arm64"}[m.Machine]
		if !slices.Equal(m.Platforms, []string{want}) {
			t.Errorf("machine %s platforms %v, want [%s]", m.Machine, m.Platforms, want)
		}
	}
	cancel()
}
