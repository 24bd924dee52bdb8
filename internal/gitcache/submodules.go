package gitcache

import (
	"bytes"
	"context"
	"fmt"
	"strings"
)

// Gitlink is a submodule in a tree: its path relative to the tree and the
// commit of the submodule's repository it pins.
type Gitlink struct {
	Path, Commit string
}

// Gitlinks lists the submodules in the tree treeish of the clone: its
// gitlink entries, which `git archive` writes as empty directories. One
// git process.
func Gitlinks(ctx context.Context, clone, treeish string) ([]Gitlink, error) {
	cmd := command(ctx, clone, "ls-tree", "-r", "-z", treeish)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, &Error{Args: []string{"ls-tree", "-r", treeish}, Err: err, Stderr: stderr.String()}
	}
	var links []Gitlink
	for _, e := range strings.Split(string(out), "\x00") {
		// <mode> SP <type> SP <object> TAB <path>
		meta, p, ok := strings.Cut(e, "\t")
		if f := strings.Fields(meta); ok && len(f) == 3 && f[1] == "commit" {
			links = append(links, Gitlink{Path: p, Commit: f[2]})
		}
	}
	return links, nil
}

// SubmoduleURLs reads the .gitmodules file at the root of commit (which
// the clone holds): the url of each submodule by its path, relative to the
// repository's root, as the file spells it (a relative url is resolved
// with ResolveURL). A commit without the file has none; a submodule
// without a path or url is left out. Read by git itself (git config
// --blob), in one process.
func SubmoduleURLs(ctx context.Context, clone, commit string) (map[string]string, error) {
	blob := commit + ":.gitmodules"
	objs, err := Objects(ctx, clone, blob)
	if err != nil {
		return nil, err
	}
	urls := map[string]string{}
	if objs[0].Type != "blob" {
		return urls, nil
	}
	cmd := command(ctx, clone, "config", "--blob", blob, "-z", "--list")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, &Error{Args: []string{"config", "--blob", blob, "--list"}, Err: err, Stderr: stderr.String()}
	}
	// submodule.<name>.<key> NL <value> NUL; a name may hold dots.
	paths, byName := map[string]string{}, map[string]string{}
	for _, e := range strings.Split(string(out), "\x00") {
		k, v, _ := strings.Cut(e, "\n")
		rest, ok := strings.CutPrefix(k, "submodule.")
		if !ok {
			continue
		}
		i := strings.LastIndexByte(rest, '.')
		if i < 0 {
			continue
		}
		switch name, key := rest[:i], rest[i+1:]; key {
		case "path":
			paths[name] = strings.Trim(v, "/")
		case "url":
			byName[name] = v
		}
	}
	for name, p := range paths {
		if u := byName[name]; p != "" && u != "" {
			urls[p] = u
		}
	}
	return urls, nil
}

// ResolveURL is a submodule's url as git resolves it for the repository
// at super: a url beginning "./" or "../" is relative to super (each "../"
// drops one component of super's path, so "../lib.git" of
// https://git.example/org/fleet.git is https://git.example/org/lib.git),
// and any other is returned as it is. A relative url that climbs above
// super's host, or its root, is an error.
func ResolveURL(super, rel string) (string, error) {
	if !strings.HasPrefix(rel, "./") && !strings.HasPrefix(rel, "../") {
		return rel, nil
	}
	prefix, p := splitURL(strings.TrimRight(super, "/"))
	var parts []string
	if p != "" {
		parts = strings.Split(p, "/")
	}
	rest := rel
	for {
		if r, ok := strings.CutPrefix(rest, "./"); ok {
			rest = r
			continue
		}
		if r, ok := strings.CutPrefix(rest, "../"); ok {
			// A leading "" is the root of an absolute path: never dropped.
			if len(parts) == 0 || len(parts) == 1 && parts[0] == "" {
				return "", fmt.Errorf("submodule url %q climbs above %s", rel, super)
			}
			parts, rest = parts[:len(parts)-1], r
			continue
		}
		break
	}
	return prefix + strings.Join(append(parts, rest), "/"), nil
}

// splitURL splits a repository's url into what a relative url keeps (a
// scheme and host, or scp-like host:) and the path it climbs.
func splitURL(u string) (prefix, path string) {
	if i := strings.Index(u, "://"); i >= 0 {
		rest := u[i+3:]
		j := strings.IndexByte(rest, '/')
		if j < 0 {
			return u + "/", ""
		}
		return u[:i+3+j+1], rest[j+1:]
	}
	// scp-like host:path, unless the colon comes after a slash.
	if i := strings.IndexByte(u, ':'); i >= 0 && !strings.Contains(u[:i], "/") {
		return u[:i+1], u[i+1:]
	}
	return "", u
}
