package gitcache

import (
	"context"
	"fmt"
	"path"
	"regexp"
	"strings"
)

// Resolution is a commit and the tree ids of paths at it.
type Resolution struct {
	// Commit is the full hash of the commit resolved.
	Commit string
	// Trees are the tree ids by path as asked ("" and "." are the root);
	// a path that is not a directory at the commit maps to "".
	Trees map[string]string
}

// Resolve makes sure the clone of repo holds commit (a full hash, a ref
// name, or "HEAD" or "" for the server's HEAD), and returns its full hash
// and the tree id of every path at it. Two commits that leave a path alone
// give it the same tree id, so a hash over the tree id (and not the commit)
// changes only when the build context does.
func (c *Cache) Resolve(ctx context.Context, repo, commit string, paths []string) (Resolution, error) {
	if commit == "" {
		commit = "HEAD"
	}
	clone, full, err := c.Fetch(ctx, repo, commit)
	if err != nil {
		return Resolution{}, fmt.Errorf("resolving %s at %s: %w", repo, commit, err)
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = TreeName(full, cleanPath(p))
	}
	objs, err := Objects(ctx, clone, names...)
	if err != nil {
		return Resolution{}, fmt.Errorf("reading the clone of %s: %w", repo, err)
	}
	res := Resolution{Commit: full, Trees: make(map[string]string, len(paths))}
	for i, p := range paths {
		if objs[i].Type == "tree" {
			res.Trees[p] = objs[i].ID
		} else {
			res.Trees[p] = ""
		}
	}
	return res, nil
}

// TreeName is the revision of the tree at sub ("" for the root) of commit.
func TreeName(commit, sub string) string {
	if sub == "" {
		return commit + "^{tree}"
	}
	return commit + ":" + sub
}

// cleanPath is a path relative to the repository's root, "" for the root.
func cleanPath(p string) string {
	p = path.Clean("/" + strings.TrimSpace(p))
	return strings.TrimPrefix(p, "/")
}

var treeRE = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// Changed lists the paths that differ between two trees of repo's clone
// (tree ids Resolve returned, both already fetched), relative to the trees,
// sorted as git lists them.
func (c *Cache) Changed(ctx context.Context, repo, from, to string) ([]string, error) {
	if !treeRE.MatchString(from) || !treeRE.MatchString(to) {
		return nil, fmt.Errorf("gitcache: %q or %q is not a tree id", from, to)
	}
	clone, err := c.Clone(repo)
	if err != nil {
		return nil, err
	}
	// Both trees are in the clone: read without its lock, as Fetch reads a
	// commit it holds.
	out, err := Git(ctx, clone, "diff-tree", "-r", "--name-only", "--no-renames", from, to)
	if err != nil {
		return nil, fmt.Errorf("comparing trees of %s: %w", repo, err)
	}
	var paths []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			paths = append(paths, l)
		}
	}
	return paths, nil
}
