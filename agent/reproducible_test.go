package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// TestReproducibleImagesOneDigestOnTwoDaemons builds one module on two
// machines (separate buildkitd daemons, no shared cache, separate
// workspaces): the same content gives one digest, and so does a later
// commit that touches only a file the Dockerfile never copies. A commit that
// changes a copied file gives another digest (the test can fail). The image
// config's created time and every history entry it made are the epoch.
func TestReproducibleImagesOneDigestOnTwoDaemons(t *testing.T) {
	testenv.RequireBuildkit(t)
	reg := registrytest.Registry(t)
	bkA := testenv.Buildkitd(t, reg)
	bkB := testenv.Buildkitd(t, reg)
	base := busyboxBase(t, reg)
	git, c1 := testenv.GitRepo(t, map[string]string{
		"app/Dockerfile": "FROM busybox\nCOPY app.txt /app/app.txt\nRUN echo built > /app/stamp && mkdir -p /app/dir\n",
		"app/app.txt":    "one\n",
		"app/README.md":  "first\n",
	})
	machine := func(bk string) func(commit string) string {
		b, err := agent.NewBuildKit(bk, agent.BuildKitOptions{Registry: registry.NewClient(registry.WithInsecure(true))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		src := &agent.Sources{Dir: t.TempDir(), InsteadOf: map[string]string{realRepo: git}}
		return func(commit string) string {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			dir, err := src.Checkout(ctx, mesh.Source{Repo: realRepo, Commit: commit, Path: "app"})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Release(dir)
			res, err := b.Build(ctx, agent.BuildRequest{Ask: mesh.Ask{Image: reg + "/app", Bases: []mesh.Base{base}}, ContextDir: dir})
			if err != nil {
				t.Fatalf("build of %s on %s: %v", short(commit), bk, err)
			}
			return res.Digest
		}
	}
	a, b := machine(bkA), machine(bkB)

	onA := a(c1)
	// Time passes between the builds: file times and the build's own
	// time differ, the image does not.
	time.Sleep(1100 * time.Millisecond)
	onB := b(c1)
	if onA != onB {
		t.Fatalf("the same commit built on two daemons: %s and %s, want one digest", onA, onB)
	}
	c2 := testenv.Commit(t, git, map[string]string{"app/README.md": "second\n"})
	if got := b(c2); got != onA {
		t.Fatalf("a commit touching only README.md (never copied): %s, want %s", got, onA)
	}
	c3 := testenv.Commit(t, git, map[string]string{"app/app.txt": "two\n"})
	if got := a(c3); got == onA {
		t.Fatalf("a commit changing the copied app.txt kept digest %s", got)
	}

	ref, err := name.ParseReference(reg+"/app@"+onA, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	epoch := time.Unix(0, 0).UTC()
	if !cfg.Created.Time.Equal(epoch) {
		t.Errorf("config created %s, want %s", cfg.Created.Time, epoch)
	}
	for i, h := range cfg.History {
		if h.Created.Time.After(epoch) {
			t.Errorf("history[%d] (%s) created %s, after the epoch", i, h.CreatedBy, h.Created.Time)
		}
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) < 3 {
		t.Fatalf("%d layers: want busybox's, COPY's and RUN's", len(layers))
	}
}

func short(s string) string { return s[:min(len(s), 12)] }

// TestSourceDateEpochIsChecked: a negative epoch is refused, naming it.
func TestSourceDateEpochIsChecked(t *testing.T) {
	_, err := agent.NewBuildKit("unix:///nonexistent", agent.BuildKitOptions{SourceDateEpoch: -1})
	if err == nil || !strings.Contains(err.Error(), "source date epoch") {
		t.Fatalf("err %v: want a refusal of the negative source date epoch", err)
	}
}
