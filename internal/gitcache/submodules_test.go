package gitcache_test

import (
	"context"
	"maps"
	"testing"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// A submodule's relative url is resolved as git resolves it: against the
// repository's url, each "../" one component up, never above the host or
// the root.
func TestResolveURL(t *testing.T) {
	for _, c := range []struct{ super, rel, want string }{
		{"https://git.example/org/fleet.git", "../lib.git", "https://git.example/org/lib.git"},
		{"https://git.example/org/fleet.git/", "../../other/lib.git", "https://git.example/other/lib.git"},
		{"https://git.example/org/fleet.git", "./lib", "https://git.example/org/fleet.git/lib"},
		{"https://git.example/fleet.git", "../lib.git", "https://git.example/lib.git"},
		{"https://git.example/fleet.git", "../../lib.git", ""},
		{"git@git.example:org/fleet.git", "../lib.git", "git@git.example:org/lib.git"},
		{"git@git.example:fleet.git", "../lib.git", "git@git.example:lib.git"},
		{"git@git.example:fleet.git", "../../lib.git", ""},
		{"ssh://git@git.example:2222/org/fleet", "../lib", "ssh://git@git.example:2222/org/lib"},
		{"/srv/git/fleet.git", "../lib.git", "/srv/git/lib.git"},
		{"/fleet", "../../lib", ""},
		{"file:///srv/git/fleet.git", "../lib.git", "file:///srv/git/lib.git"},
		{"https://git.example/org/fleet.git", "https://elsewhere.example/lib.git", "https://elsewhere.example/lib.git"},
		{"https://git.example/org/fleet.git", "git@elsewhere.example:lib.git", "git@elsewhere.example:lib.git"},
	} {
		got, err := gitcache.ResolveURL(c.super, c.rel)
		if c.want == "" {
			if err == nil {
				t.Errorf("ResolveURL(%q, %q) = %q, want an error", c.super, c.rel, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ResolveURL(%q, %q) = %q, %v, want %q", c.super, c.rel, got, err, c.want)
		}
	}
}

// .gitmodules is read at a commit by git: each submodule's url by its
// path, whatever its name (dots and all); one without a url is left out,
// and a commit without the file has none. Gitlinks lists the gitlinks of a
// tree with the commits they pin.
func TestSubmoduleURLsAndGitlinks(t *testing.T) {
	ctx := context.Background()
	repo, first := testenv.GitRepo(t, map[string]string{"app/Dockerfile": "FROM scratch\n"})
	pin := first // any commit: nothing fetches it here
	testenv.Submodule(t, repo, "app/vendor/lib", "../lib.git", pin)
	testenv.Commit(t, repo, map[string]string{".gitmodules": `[submodule "app/vendor/lib"]
	path = app/vendor/lib
	url = ../lib.git
[submodule "v1.2.deps"]
	path = app/deps/
	url = https://git.example/deps.git
[submodule "no-url"]
	path = app/none
`})
	testenv.Submodule(t, repo, "app/deps", "", pin) // .gitmodules as written above
	c := &gitcache.Cache{Dir: t.TempDir()}
	clone, head, err := c.Fetch(ctx, repo, "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	urls, err := gitcache.SubmoduleURLs(ctx, clone, head)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"app/vendor/lib": "../lib.git", "app/deps": "https://git.example/deps.git"}
	if !maps.Equal(urls, want) {
		t.Errorf("SubmoduleURLs = %v, want %v", urls, want)
	}
	links, err := gitcache.Gitlinks(ctx, clone, head+":app")
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 2 || links[0] != (gitcache.Gitlink{Path: "deps", Commit: pin}) || links[1] != (gitcache.Gitlink{Path: "vendor/lib", Commit: pin}) {
		t.Errorf("Gitlinks = %+v, want deps and vendor/lib at %s", links, pin)
	}
	if _, first, err = c.Fetch(ctx, repo, first); err != nil {
		t.Fatal(err)
	}
	if urls, err := gitcache.SubmoduleURLs(ctx, clone, first); err != nil || len(urls) != 0 {
		t.Errorf("a commit without .gitmodules: %v, %v, want none", urls, err)
	}
}
