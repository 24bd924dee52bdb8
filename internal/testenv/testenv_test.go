package testenv_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/internal/buildkitd"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

func TestRegistryBusybox(t *testing.T) {
	host := registrytest.Registry(t)
	ref := testenv.Busybox(t, host)
	if !strings.HasPrefix(ref, host+"/busybox@sha256:") {
		t.Fatalf("Busybox = %s", ref)
	}
	got, err := registry.NewClient().Resolve(context.Background(), host+"/busybox:latest")
	if err != nil {
		t.Fatal(err)
	}
	if want := ref[strings.Index(ref, "@")+1:]; got != want {
		t.Errorf("latest = %s, want %s", got, want)
	}
}

func TestGitRepo(t *testing.T) {
	dir, c1 := testenv.GitRepo(t, map[string]string{"a/Dockerfile": "FROM runtime\n", "README": "hi"})
	c2 := testenv.Commit(t, dir, map[string]string{"a/Dockerfile": "FROM other\n"})
	if c1 == c2 || len(c1) != 40 || len(c2) != 40 {
		t.Fatalf("commits %q %q", c1, c2)
	}
	out, err := exec.Command("git", "-C", dir, "show", c1+":a/Dockerfile").Output()
	if err != nil || string(out) != "FROM runtime\n" {
		t.Errorf("a/Dockerfile at first commit = %q, %v", out, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "a", "Dockerfile"))
	if err != nil || string(b) != "FROM other\n" {
		t.Errorf("work tree a/Dockerfile = %q, %v", b, err)
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
}

func TestBuildkitd(t *testing.T) {
	host := registrytest.Registry(t)
	root := t.TempDir()
	addr := testenv.BuildkitdWith(t, buildkitd.Options{Root: root, RegistryHosts: []string{host}, MaxParallelism: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := buildkitd.Ping(ctx, addr); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	conf, err := os.ReadFile(filepath.Join(root, "buildkitd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"max-parallelism = 1", "[registry.\"" + host + "\"]"} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("buildkitd.toml lacks %q:\n%s", want, conf)
		}
	}
}
