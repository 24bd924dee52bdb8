package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// Attestations where users' tools look, on real parts (buildkitd, the
// embedded registry and Debian's docker-registry, which has no referrers
// API, and buildx): the tag names BuildKit's layout (an index of the image
// and its attestation manifest) whose provenance `buildx imagetools
// inspect` finds, naming the base digest; the attestation manifest is a
// referrer of the image digest; the image manifest carries the OCI base
// and source annotations; and a second commit that touches no file of the
// image gives the same image digest, its revision only on the tag's index.
func TestAttestationsWhereToolsLook(t *testing.T) {
	testenv.RequireBuildkit(t)
	regs := map[string]string{"embedded": registrytest.Registry(t), "docker-registry": testenv.DebianRegistry(t)}
	bk := testenv.Buildkitd(t, regs["embedded"], regs["docker-registry"])
	b := realBuildKit(t, bk)
	git, first := testenv.GitRepo(t, map[string]string{
		"app/Dockerfile": "FROM busybox AS build\nRUN echo built > /b.txt\nFROM build\nCOPY app.txt /app.txt\n",
		"app/app.txt":    "one\n",
		"docs/README":    "one\n",
	})
	second := testenv.Commit(t, git, map[string]string{"docs/README": "two\n"})
	src := &agent.Sources{Dir: t.TempDir(), InsteadOf: map[string]string{realRepo: git}}
	rc := registry.NewClient(registry.WithInsecure(true))

	for _, kind := range []string{"embedded", "docker-registry"} {
		t.Run(kind, func(t *testing.T) {
			reg := regs[kind]
			baseRepo, baseDigest := name2(testenv.Busybox(t, reg))
			build := func(commit string) agent.Result {
				t.Helper()
				res, _ := buildApp(t, b, src, mesh.Source{Repo: realRepo, Commit: commit, Path: "app"}, reg, baseRepo, baseDigest)
				if res.Attestations == nil || res.Attestations.Manifest == "" || res.Attestations.Provenance == "" {
					t.Fatalf("attestations %+v: want an index, its attestation manifest and a provenance", res.Attestations)
				}
				return res
			}
			one, two := build(first), build(second)
			if one.Digest != two.Digest {
				t.Errorf("image %s at %s, %s at %s: a commit that touches no file of the image changed its digest", one.Digest, first, two.Digest, second)
			}
			ctx := context.Background()

			// The image manifest: the base of the final stage (through the
			// stage it is built FROM) and the source; no revision.
			img, err := rc.Get(ctx, reg+"/app@"+two.Digest)
			if err != nil {
				t.Fatal(err)
			}
			var m v1.Manifest
			if err := json.Unmarshal(img.Manifest, &m); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				ocispec.AnnotationBaseImageDigest: baseDigest,
				ocispec.AnnotationBaseImageName:   baseRepo,
				ocispec.AnnotationSource:          realRepo,
			}
			for k, v := range want {
				if m.Annotations[k] != v {
					t.Errorf("image manifest annotation %s = %q, want %q (all: %v)", k, m.Annotations[k], v, m.Annotations)
				}
			}
			if r, ok := m.Annotations[ocispec.AnnotationRevision]; ok {
				t.Errorf("image manifest has the revision %s: it would change the identity with every commit", r)
			}

			// The tag names the index of the image and its attestation
			// manifest (BuildKit's layout), the revision on it; the
			// identity behind the tag is the image.
			tagged, err := rc.Get(ctx, reg+"/app:latest")
			if err != nil {
				t.Fatal(err)
			}
			if tagged.Digest.String() != two.Attestations.Index || !tagged.MediaType.IsIndex() {
				t.Errorf("app:latest is %s %s, want the index %s", tagged.MediaType, tagged.Digest, two.Attestations.Index)
			}
			var idx v1.IndexManifest
			if err := json.Unmarshal(tagged.Manifest, &idx); err != nil {
				t.Fatal(err)
			}
			if idx.Annotations[ocispec.AnnotationRevision] != second || idx.Annotations[ocispec.AnnotationBaseImageDigest] != baseDigest {
				t.Errorf("the tag's index annotations %v: want revision %s and base %s", idx.Annotations, second, baseDigest)
			}
			if id, err := rc.Identity(ctx, reg+"/app:latest"); err != nil || id != two.Digest {
				t.Errorf("identity of app:latest = %s (%v), want the image %s", id, err, two.Digest)
			}

			// The attestation manifest is a referrer of the image, through
			// the referrers API or the tag schema.
			refs, err := rc.Referrers(ctx, reg+"/app@"+two.Digest)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, d := range refs {
				if d.Digest.String() == two.Attestations.Manifest && d.ArtifactType == "application/vnd.docker.attestation.manifest.v1+json" {
					found = true
				}
			}
			if !found {
				t.Errorf("referrers of %s: %+v, want the attestation manifest %s", two.Digest, refs, two.Attestations.Manifest)
			}
			api, err := http.Get("http://" + reg + "/v2/app/referrers/" + two.Digest)
			if err != nil {
				t.Fatal(err)
			}
			api.Body.Close()
			schema := reg + "/app:" + strings.Replace(two.Digest, ":", "-", 1)
			if _, err := rc.Resolve(ctx, schema); err != nil {
				t.Errorf("the referrers tag %s: %v", schema, err)
			}
			t.Logf("%s: referrers API answers %d; referrers tag %s present", kind, api.StatusCode, schema)

			// buildx, as a user runs it, finds the provenance from the tag,
			// naming the base by digest.
			prov := testenv.ImagetoolsInspect(t, reg+"/app:latest", "{{json .Provenance}}")
			if !strings.Contains(prov, strings.TrimPrefix(baseDigest, "sha256:")) || !strings.Contains(prov, "busybox") {
				t.Errorf("buildx imagetools inspect %s/app:latest --format '{{json .Provenance}}' does not name the base %s:\n%s", reg, baseDigest, prov)
			}
			if !strings.Contains(prov, second) {
				t.Errorf("the provenance does not name the revision %s:\n%s", second, prov)
			}
			var pretty bytes.Buffer
			if json.Indent(&pretty, []byte(prov), "", "  ") == nil && pretty.Len() > 1500 {
				pretty.Truncate(1500)
			}
			t.Logf("buildx imagetools inspect %s/app:latest --format '{{json .Provenance}}':\n%s…", reg, pretty.String())
			_ = name.Insecure
			_ = remote.Get
		})
	}
}
