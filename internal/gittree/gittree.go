// Package gittree names what a build context is made of: the git tree id of
// a path at a commit. Two commits that leave a path alone give it the same
// tree id, so a hash over the tree id (and not the commit) changes only when
// the build context does.
//
// A Cache keeps one bare clone per repository under its Dir, as the agents'
// workspaces do, and fetches into it only what it lacks: a commit named by
// its full hash that the clone has is never fetched again. Repository URLs
// are rewritten with InsteadOf (git's url.<base>.insteadOf) before they are
// fetched. The git command line does the work; credentials are never
// prompted for.
//
//	c := &gittree.Cache{Dir: "/var/lib/meshbuild/controller/repos"}
//	res, err := c.Resolve(ctx, "https://git.example/fleet.git", "HEAD", []string{"base", "runtime"})
//	// res.Commit is HEAD's full hash; res.Trees["base"] its tree id at base/
//	// ("" when the commit has no such directory).
package gittree

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// ErrNotFound is wrapped when the repository has no such commit.
var ErrNotFound = errors.New("commit not found")

// Cache resolves commits and tree ids from bare clones under Dir. Set Dir;
// the rest of the zero value is ready. It is safe for concurrent use
// (fetches into one clone are serialised), not by two processes sharing
// Dir.
type Cache struct {
	// Dir holds the bare clones.
	Dir string
	// InsteadOf rewrites repository URLs before they are fetched: a repo
	// starting with a key is fetched from the value followed by the rest
	// (the longest key wins).
	InsteadOf map[string]string

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// Resolution is a commit and the tree ids of paths at it.
type Resolution struct {
	// Commit is the full hash of the commit resolved.
	Commit string
	// Trees are the tree ids by path as asked ("" and "." are the root);
	// a path that is not a directory at the commit maps to "".
	Trees map[string]string
}

var (
	commitRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
	fullHashRE = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)
)

// Resolve makes sure the clone of repo holds commit (a full hash, a ref
// name, or "HEAD" or "" for the server's HEAD), and returns its full hash
// and the tree id of every path at it.
func (c *Cache) Resolve(ctx context.Context, repo, commit string, paths []string) (Resolution, error) {
	if c.Dir == "" {
		return Resolution{}, errors.New("gittree: Dir is not set")
	}
	if commit == "" {
		commit = "HEAD"
	}
	if repo == "" || strings.HasPrefix(repo, "-") {
		return Resolution{}, fmt.Errorf("gittree: %q is not a repository", repo)
	}
	if !commitRE.MatchString(commit) || strings.Contains(commit, "..") {
		return Resolution{}, fmt.Errorf("gittree: %q is not a commit", commit)
	}
	root, err := filepath.Abs(c.Dir)
	if err != nil {
		return Resolution{}, err
	}
	key := sha256.Sum256([]byte(repo))
	clone := filepath.Join(root, hex.EncodeToString(key[:12])+".git")
	full, err := c.fetch(ctx, clone, c.rewrite(repo), commit)
	if err != nil {
		return Resolution{}, fmt.Errorf("resolving %s at %s: %w", repo, commit, err)
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = full + "^{tree}"
		if sub := cleanPath(p); sub != "" {
			names[i] = full + ":" + sub
		}
	}
	trees, err := treeIDs(ctx, clone, names)
	if err != nil {
		return Resolution{}, fmt.Errorf("reading the clone of %s: %w", repo, err)
	}
	res := Resolution{Commit: full, Trees: make(map[string]string, len(paths))}
	for i, p := range paths {
		res.Trees[p] = trees[i]
	}
	return res, nil
}

// cleanPath is a path relative to the repository's root, "" for the root.
func cleanPath(p string) string {
	p = path.Clean("/" + strings.TrimSpace(p))
	return strings.TrimPrefix(p, "/")
}

func (c *Cache) rewrite(repo string) string {
	keys := make([]string, 0, len(c.InsteadOf))
	for k := range c.InsteadOf {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for _, k := range keys {
		if k != "" && strings.HasPrefix(repo, k) {
			return c.InsteadOf[k] + strings.TrimPrefix(repo, k)
		}
	}
	return repo
}

func (c *Cache) lock(clone string) func() {
	c.mu.Lock()
	if c.locks == nil {
		c.locks = map[string]*sync.Mutex{}
	}
	m, ok := c.locks[clone]
	if !ok {
		m = &sync.Mutex{}
		c.locks[clone] = m
	}
	c.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// fetch makes sure the clone holds commit and returns its full hash.
func (c *Cache) fetch(ctx context.Context, clone, url, commit string) (string, error) {
	defer c.lock(clone)()
	if _, err := os.Stat(filepath.Join(clone, "HEAD")); err != nil {
		if err := os.MkdirAll(filepath.Dir(clone), 0o755); err != nil {
			return "", err
		}
		if _, err := git(ctx, "", "init", "--quiet", "--bare", clone); err != nil {
			return "", err
		}
	}
	if _, err := git(ctx, clone, "config", "remote.origin.url", url); err != nil {
		return "", err
	}
	if fullHashRE.MatchString(commit) {
		if h, err := revParse(ctx, clone, commit); err == nil {
			return h, nil
		}
		if _, err := git(ctx, clone, "fetch", "--quiet", "--no-tags", "origin", commit); err == nil {
			if h, err := revParse(ctx, clone, commit); err == nil {
				return h, nil
			}
		}
	}
	if commit == "HEAD" {
		if _, err := git(ctx, clone, "fetch", "--quiet", "--no-tags", "origin", "HEAD"); err != nil {
			return "", err
		}
		return revParse(ctx, clone, "FETCH_HEAD")
	}
	if _, err := git(ctx, clone, "fetch", "--quiet", "--prune", "--force", "origin",
		"+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"); err != nil {
		return "", err
	}
	h, err := revParse(ctx, clone, commit)
	if err != nil {
		return "", fmt.Errorf("%w: %s", ErrNotFound, commit)
	}
	return h, nil
}

func revParse(ctx context.Context, clone, commit string) (string, error) {
	return git(ctx, clone, "rev-parse", "--verify", "--quiet", "--end-of-options", commit+"^{commit}")
}

// treeIDs asks the clone, in one git process, for the id of each name that
// is a tree ("" for one that is not).
func treeIDs(ctx context.Context, clone string, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	cmd := exec.CommandContext(ctx, "git", "--git-dir="+clone, "cat-file", "--batch-check=%(objectname) %(objecttype)")
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git cat-file: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(names) {
		return nil, fmt.Errorf("git cat-file answered %d lines for %d names", len(lines), len(names))
	}
	ids := make([]string, len(lines))
	for i, l := range lines {
		if f := strings.Fields(l); len(f) == 2 && f[1] == "tree" {
			ids[i] = f[0]
		}
	}
	return ids, nil
}

// git runs git against the repository at gitDir ("" for none) and returns
// its trimmed output. It never prompts for credentials.
func git(ctx context.Context, gitDir string, args ...string) (string, error) {
	full := args
	if gitDir != "" {
		full = append([]string{"--git-dir=" + gitDir}, args...)
	}
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, msg)
	}
	return strings.TrimSpace(stdout.String()), nil
}
