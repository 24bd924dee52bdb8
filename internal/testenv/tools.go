package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Buildx returns the repository's bin/buildx (`make deps` builds it from
// tools/buildx). It skips t unless MESHBUILD_BUILDKIT=1, and fails it when
// the binary is missing.
func Buildx(t testing.TB) string {
	t.Helper()
	RequireBuildkit(t)
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "buildx")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("buildx: %v (make deps builds bin/buildx)", err)
	}
	return bin
}

// ImagetoolsInspect runs `buildx imagetools inspect ref --format format`
// with a docker config of its own (no credentials) and returns its output.
func ImagetoolsInspect(t testing.TB, ref, format string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, Buildx(t), "imagetools", "inspect", ref, "--format", format)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir(), "BUILDX_CONFIG="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("buildx imagetools inspect %s: %v\n%s", ref, err, out)
	}
	return string(out)
}

// DebianRegistry starts Debian's docker-registry (distribution 2.8, which
// has no OCI referrers API) on a free loopback port, its content in a temp
// dir, and returns its host:port. It skips t unless MESHBUILD_BUILDKIT=1
// and fails it when the registry is not installed (make deps installs it).
// It stops in cleanup.
func DebianRegistry(t testing.TB) string {
	t.Helper()
	RequireBuildkit(t)
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Fatalf("docker-registry: %v (make deps installs Debian's docker-registry)", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "config.yml")
	err = os.WriteFile(conf, fmt.Appendf(nil, `version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: %s}
  delete: {enabled: true}
http: {addr: %s}
`, filepath.Join(dir, "data"), addr), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var log Buffer
	cmd := exec.Command(bin, "serve", conf)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("docker-registry: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("docker-registry log:\n%s", log.String())
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("docker-registry at %s does not answer: %v\n%s", addr, err, strings.TrimSpace(log.String()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
