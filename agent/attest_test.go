package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// statement is the part of an in-toto statement of SLSA provenance v0.2
// the test reads.
type statement struct {
	Type          string `json:"_type"`
	PredicateType string `json:"predicateType"`
	Subject       []struct {
		Digest map[string]string `json:"digest"`
	} `json:"subject"`
	Predicate struct {
		Materials []struct {
			URI    string            `json:"uri"`
			Digest map[string]string `json:"digest"`
		} `json:"materials"`
		Invocation struct {
			ConfigSource struct {
				EntryPoint string `json:"entryPoint"`
			} `json:"configSource"`
			Parameters struct {
				Args map[string]string `json:"args"`
			} `json:"parameters"`
		} `json:"invocation"`
		Metadata struct {
			BuildKit struct {
				VCS map[string]string `json:"vcs"`
			} `json:"https://mobyproject.org/buildkit@v1#metadata"`
		} `json:"metadata"`
	} `json:"predicate"`
}

// Every image is pushed with its provenance, on real parts (buildkitd, a
// registry): the pushed index holds the image and an attestation manifest
// for it, whose provenance statement names the exact base digest, the
// repository, the commit, the context path and the Dockerfile. The
// image's digest is the image manifest's, the same on a second build (the
// index is not: the provenance records the build's time), and the tag
// names the index. A module that
// turns provenance off is pushed as a bare image.
func TestProvenanceIsPushedWithTheImage(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	repo, dg := name2(testenv.Busybox(t, reg))
	git, commit := testenv.GitRepo(t, map[string]string{
		"app/docker/Dockerfile": "FROM busybox\nCOPY app.txt /app.txt\n",
		"app/app.txt":           "one\n",
	})
	b := realBuildKit(t, bk)
	src := &agent.Sources{Dir: t.TempDir(), InsteadOf: map[string]string{realRepo: git}}
	build := func(s mesh.Source) (agent.Result, []string) {
		t.Helper()
		return buildApp(t, b, src, s, reg, repo, dg)
	}
	source := mesh.Source{Repo: realRepo, Commit: commit, Path: "app", Dockerfile: "docker/Dockerfile"}
	res, log := build(source)
	a := res.Attestations
	if a == nil || a.Index == "" || a.Index == res.Digest || a.Manifest == "" || a.Provenance == "" || a.SBOM != "" {
		t.Fatalf("attestations %+v of image %s: want an index, its attestation manifest and a provenance, no SBOM", a, res.Digest)
	}
	if !strings.Contains(strings.Join(log, "\n"), "sbom: off: this machine has no SBOM generator") {
		t.Errorf("the build log does not say the SBOM is off:\n%s", strings.Join(log, "\n"))
	}

	// The tag names the index (BuildKit's layout, where tools look for
	// the attestations); the image in it is the identity.
	if got, err := registry.NewClient(registry.WithInsecure(true)).Resolve(context.Background(), reg+"/app:latest"); err != nil || got != a.Index {
		t.Errorf("app:latest resolves to %s (%v), want the index %s", got, err, a.Index)
	}

	// The index, read back: the image and, for it, the attestation
	// manifest.
	idxRef, _ := name.ParseReference(reg+"/app@"+a.Index, name.Insecure)
	idx, err := remote.Index(idxRef)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var image, att *v1.Descriptor
	for i, m := range im.Manifests {
		switch {
		case m.Annotations["vnd.docker.reference.type"] == "attestation-manifest":
			att = &im.Manifests[i]
		default:
			image = &im.Manifests[i]
		}
	}
	if len(im.Manifests) != 2 || image == nil || att == nil {
		t.Fatalf("index %s holds %+v: want the image and its attestation manifest", a.Index, im.Manifests)
	}
	if image.Digest.String() != res.Digest || att.Digest.String() != a.Manifest || att.Annotations["vnd.docker.reference.digest"] != res.Digest {
		t.Errorf("index: image %s, attestation %s for %s; want image %s, attestation %s for it",
			image.Digest, att.Digest, att.Annotations["vnd.docker.reference.digest"], res.Digest, a.Manifest)
	}

	// The provenance: an in-toto statement layer of the attestation
	// manifest, about the image, naming the exact base digest.
	attImg, err := remote.Image(idxRef.Context().Digest(a.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := attImg.LayerByDigest(v1.Hash{Algorithm: "sha256", Hex: strings.TrimPrefix(a.Provenance, "sha256:")})
	if err != nil {
		t.Fatal(err)
	}
	mt, _ := layer.MediaType()
	rc, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	var st statement
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("provenance layer (%s): %v\n%s", mt, err, data)
	}
	if !strings.HasPrefix(st.Type, "https://in-toto.io/Statement") || !strings.HasPrefix(st.PredicateType, "https://slsa.dev/provenance/") {
		t.Errorf("statement type %q, predicate %q: want an in-toto statement of SLSA provenance", st.Type, st.PredicateType)
	}
	if len(st.Subject) == 0 || "sha256:"+st.Subject[0].Digest["sha256"] != res.Digest {
		t.Errorf("statement subjects %+v: want the image %s", st.Subject, res.Digest)
	}
	baseFound := false
	for _, m := range st.Predicate.Materials {
		if "sha256:"+m.Digest["sha256"] == dg && strings.Contains(m.URI, "busybox") {
			baseFound = true
		}
	}
	if !baseFound {
		t.Errorf("materials %+v: want the base busybox at %s", st.Predicate.Materials, dg)
	}
	vcs := st.Predicate.Metadata.BuildKit.VCS
	if vcs["source"] != realRepo || vcs["revision"] != commit || vcs["localdir:context"] != "app" || vcs["localdir:dockerfile"] != "app/docker" {
		t.Errorf("vcs %v: want source %s, revision %s, context app, dockerfile app/docker", vcs, realRepo, commit)
	}
	if ep := st.Predicate.Invocation.ConfigSource.EntryPoint; ep != "Dockerfile" {
		t.Errorf("entry point %q, want the Dockerfile", ep)
	}
	if ctxArg := st.Predicate.Invocation.Parameters.Args["context:busybox"]; !strings.Contains(ctxArg, dg) {
		t.Errorf("the named context busybox is %q in the provenance's args, want it pinned to %s", ctxArg, dg)
	}

	// Built again: the same image, another index (the provenance records
	// when it was built).
	again, _ := build(source)
	if again.Digest != res.Digest {
		t.Errorf("built again: image %s, want %s (the image is reproducible)", again.Digest, res.Digest)
	}
	if again.Attestations == nil || again.Attestations.Index == "" {
		t.Errorf("built again: attestations %+v", again.Attestations)
	}
	t.Logf("image %s; index %s then %s", res.Digest, a.Index, again.Attestations.Index)

	// Provenance off for the module: a bare image.
	off := source
	off.NoProvenance = true
	bare, log := build(off)
	if bare.Attestations != nil {
		t.Errorf("provenance off: attestations %+v, want none", bare.Attestations)
	}
	if !strings.Contains(strings.Join(log, "\n"), "provenance: off for this module (build.provenance: false)") {
		t.Errorf("the build log does not say the provenance is off:\n%s", strings.Join(log, "\n"))
	}
	desc, err := remote.Get(idxRef.Context().Digest(bare.Digest))
	if err != nil {
		t.Fatal(err)
	}
	if desc.MediaType.IsIndex() {
		t.Errorf("provenance off: pushed %s, want an image", desc.MediaType)
	}
	t.Logf("without provenance the image is %s (%s); with it %s", bare.Digest, desc.MediaType, res.Digest)
}

// The attestation options are checked: an unknown provenance mode or a
// generator that is not an image reference is refused, naming it.
func TestAttestationOptionsAreChecked(t *testing.T) {
	for _, tc := range []struct {
		opts agent.BuildKitOptions
		want string
	}{
		{agent.BuildKitOptions{Provenance: "full-please"}, `provenance "full-please": want max, min or off`},
		{agent.BuildKitOptions{SBOMGenerator: "Not An Image"}, `sbom generator "Not An Image" is not an image reference`},
	} {
		_, err := agent.NewBuildKit("unix:///nonexistent", tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", tc.opts, err, tc.want)
		}
	}
	for _, ok := range []agent.BuildKitOptions{{Provenance: agent.ProvenanceOff}, {Provenance: "min", SBOMGenerator: "127.0.0.1:5000/buildkit-syft-scanner:stable-1"}} {
		b, err := agent.NewBuildKit("unix:///nonexistent", ok)
		if err != nil {
			t.Errorf("%+v: %v", ok, err)
			continue
		}
		b.Close()
	}
}

// scanner is a stand-in SBOM generator, as BuildKit runs one: it reads the
// image's root file system at $BUILDKIT_SCAN_SOURCE and writes an in-toto
// statement with an SPDX predicate into $BUILDKIT_SCAN_DESTINATION, naming
// the files it found under /app.
const scanner = `#!/bin/sh
set -e
files=$(cd "$BUILDKIT_SCAN_SOURCE/app" && ls | tr '\n' ' ')
printf '{"_type": "https://in-toto.io/Statement/v0.1", "predicateType": "https://spdx.dev/Document", "subject": [], "predicate": {"spdxVersion": "SPDX-2.3", "SPDXID": "SPDXRef-DOCUMENT", "name": "meshbuild-test-scan", "comment": "files: %s"}}\n' "$files" > "$BUILDKIT_SCAN_DESTINATION/sbom.spdx.json"
`

// With an SBOM generator from the mesh's own registry (here a stand-in,
// built by the same BuildKit and pushed there), every image is pushed with
// an SBOM beside its provenance, in one attestation manifest; a module that
// turns the SBOM off gets the provenance alone.
func TestSBOMFromAGeneratorInTheMeshRegistry(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bk := testenv.Buildkitd(t, reg)
	repo, dg := name2(testenv.Busybox(t, reg))
	busybox := []mesh.Base{{Module: "busybox", Image: repo, Digest: dg}}
	rc := registry.NewClient(registry.WithInsecure(true))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	plain, err := agent.NewBuildKit(bk, agent.BuildKitOptions{Registry: rc, Provenance: agent.ProvenanceOff})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	scanDir := t.TempDir()
	for f, body := range map[string]string{
		"Dockerfile": "FROM busybox\nCOPY scan.sh /scan.sh\nENTRYPOINT [\"/bin/sh\", \"/scan.sh\"]\n",
		"scan.sh":    scanner,
	} {
		if err := os.WriteFile(filepath.Join(scanDir, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gen, err := plain.Build(ctx, agent.BuildRequest{Ask: mesh.Ask{Image: reg + "/sbom-scanner", Bases: busybox}, ContextDir: scanDir})
	if err != nil {
		t.Fatal(err)
	}
	if gen.Attestations != nil {
		t.Fatalf("the generator, built with provenance off, has attestations %+v", gen.Attestations)
	}

	b, err := agent.NewBuildKit(bk, agent.BuildKitOptions{Registry: rc, SBOMGenerator: gen.Ref})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	appDir := t.TempDir()
	for f, body := range map[string]string{"Dockerfile": "FROM busybox\nCOPY app.txt /app/app.txt\n", "app.txt": "one\n"} {
		if err := os.WriteFile(filepath.Join(appDir, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	build := func(s mesh.Source) agent.Result {
		t.Helper()
		var log []string
		res, err := b.Build(ctx, agent.BuildRequest{Ask: mesh.Ask{Image: reg + "/app", Source: s, Platform: mesh.DefaultPlatform, Bases: busybox},
			ContextDir: appDir, Log: func(l string) { log = append(log, l) }})
		if err != nil {
			t.Fatalf("build: %v\n%s", err, strings.Join(log, "\n"))
		}
		return res
	}
	res := build(mesh.Source{Repo: realRepo, Commit: "c0ffee"})
	a := res.Attestations
	if a == nil || a.Provenance == "" || a.SBOM == "" {
		t.Fatalf("attestations %+v: want a provenance and an SBOM", a)
	}
	attRef, _ := name.ParseReference(reg+"/app@"+a.Manifest, name.Insecure)
	attImg, err := remote.Image(attRef)
	if err != nil {
		t.Fatal(err)
	}
	layer, err := attImg.LayerByDigest(v1.Hash{Algorithm: "sha256", Hex: strings.TrimPrefix(a.SBOM, "sha256:")})
	if err != nil {
		t.Fatal(err)
	}
	r, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(r)
	r.Close()
	var st struct {
		PredicateType string `json:"predicateType"`
		Subject       []struct {
			Digest map[string]string `json:"digest"`
		} `json:"subject"`
		Predicate struct {
			Comment string `json:"comment"`
		} `json:"predicate"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("sbom layer: %v\n%s", err, data)
	}
	if st.PredicateType != "https://spdx.dev/Document" || !strings.Contains(st.Predicate.Comment, "app.txt") ||
		len(st.Subject) == 0 || "sha256:"+st.Subject[0].Digest["sha256"] != res.Digest {
		t.Errorf("sbom statement %s: want an SPDX document about %s naming app.txt", data, res.Digest)
	}

	if off := build(mesh.Source{Repo: realRepo, Commit: "c0ffee", NoSBOM: true}); off.Attestations == nil || off.Attestations.SBOM != "" || off.Attestations.Provenance == "" {
		t.Errorf("sbom off for the module: attestations %+v, want the provenance alone", off.Attestations)
	}
}
