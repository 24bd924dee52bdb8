package gittree

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

var treeRE = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// Changed lists the paths that differ between two trees of repo's clone
// (tree ids Resolve returned, both already fetched), relative to the trees,
// sorted as git lists them.
func (c *Cache) Changed(ctx context.Context, repo, from, to string) ([]string, error) {
	if c.Dir == "" {
		return nil, errors.New("gittree: Dir is not set")
	}
	if !treeRE.MatchString(from) || !treeRE.MatchString(to) {
		return nil, fmt.Errorf("gittree: %q or %q is not a tree id", from, to)
	}
	root, err := filepath.Abs(c.Dir)
	if err != nil {
		return nil, err
	}
	key := sha256.Sum256([]byte(repo))
	clone := filepath.Join(root, hex.EncodeToString(key[:12])+".git")
	defer c.lock(clone)()
	out, err := git(ctx, clone, "diff-tree", "-r", "--name-only", "--no-renames", from, to)
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
