package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// GitRepo creates a git repository in a temp dir with one commit holding
// files (path relative to the repo → content) and returns its directory and
// the commit's hash.
func GitRepo(t testing.TB, files map[string]string) (dir, commit string) {
	t.Helper()
	dir = t.TempDir()
	git(t, dir, "init", "-q", "-b", "main")
	return dir, Commit(t, dir, files)
}

// Commit writes files into the repository at dir (creating directories as
// needed), commits them all and returns the new commit's hash.
func Commit(t testing.TB, dir string, files map[string]string) string {
	t.Helper()
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(files[p]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "--allow-empty", "-m", "commit "+strings.Join(paths, " "))
	return git(t, dir, "rev-parse", "HEAD")
}

// git runs git in dir with a fixed identity and no user or system config,
// and returns its trimmed output.
func git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{
		"-c", "user.name=meshbuild test", "-c", "user.email=test@meshbuild.invalid",
		"-c", "commit.gpgsign=false",
	}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// Submodule adds to the repository at dir a submodule at path (relative to
// its root) pinned at commit, with url in .gitmodules ("" leaves
// .gitmodules alone: a gitlink without a url), as `git submodule add`
// leaves it without a checkout, commits it and returns the new commit.
func Submodule(t testing.TB, dir, path, url, commit string) string {
	t.Helper()
	if url != "" {
		git(t, dir, "config", "-f", ".gitmodules", "submodule."+path+".path", path)
		git(t, dir, "config", "-f", ".gitmodules", "submodule."+path+".url", url)
		git(t, dir, "add", ".gitmodules")
	}
	git(t, dir, "update-index", "--add", "--cacheinfo", "160000,"+commit+","+path)
	// Its directory empty, as a clone leaves a submodule not checked out:
	// a later Commit (git add -A) keeps the gitlink.
	if err := os.MkdirAll(filepath.Join(dir, filepath.FromSlash(path)), 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "commit", "-q", "-m", "submodule "+path)
	return git(t, dir, "rev-parse", "HEAD")
}
