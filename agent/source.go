package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/meshbuild/meshbuild/mesh"
)

// Sources checks out asks' build contexts. It keeps one bare clone per
// repository under Dir/repos (named by a hash of the repository's URL as
// the ask spells it), fetches into it only when the commit is not there
// yet, and writes each checkout to its own directory under Dir/work, so
// that slots building the same repository at once share the clone and
// never a work tree. Fetches into one clone are serialised; checkouts read
// it concurrently. The git command line does the work.
//
// Set Dir; the rest of the zero value is ready to use. A Sources is safe
// for concurrent use by the slots of one agent (not by two processes
// sharing Dir).
type Sources struct {
	// Dir holds the clones and the checkouts.
	Dir string
	// InsteadOf rewrites repository URLs before they are fetched, like
	// git's url.<base>.insteadOf: a repo starting with a key is fetched
	// from the value followed by the rest (the longest key wins). The demo
	// maps https://git.example/fleet.git to a local repository.
	InsteadOf map[string]string

	mu    sync.Mutex
	repos map[string]*sync.Mutex
	// origin is the URL each clone's origin was last set to (under the
	// clone's lock), so that it is set only when it changes.
	origin map[string]string
}

var (
	// A commit is a hash or a ref name; never an option.
	commitRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
	// A full object name is immutable, so a clone that has it need not fetch.
	fullHashRE = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)
)

// Checkout writes the tree at src.Path of src.Commit to a new directory and
// returns it: the build context, in which src.Dockerfile (default
// "Dockerfile") is checked to exist. A repository, commit, path or
// Dockerfile that is not there is an error wrapping ErrSource; a git server
// that cannot be reached, ErrInfra. Release the directory when the build is
// done.
func (s *Sources) Checkout(ctx context.Context, src mesh.Source) (string, error) {
	dir, _, err := s.CheckoutCommit(ctx, src)
	return dir, err
}

// CheckoutCommit is Checkout that also returns the full hash of the commit
// checked out: src.Commit resolved, when it names a ref such as HEAD.
func (s *Sources) CheckoutCommit(ctx context.Context, src mesh.Source) (dir, commit string, err error) {
	root, err := s.root()
	if err != nil {
		return "", "", err
	}
	sub, dockerfile, err := checkSource(src)
	if err != nil {
		return "", "", err
	}
	url := s.rewrite(src.Repo)
	key := sha256.Sum256([]byte(src.Repo))
	cache := filepath.Join(root, "repos", hex.EncodeToString(key[:12])+".git")

	commit, err = s.fetch(ctx, cache, url, src)
	if err != nil {
		return "", "", err
	}

	// The path and the Dockerfile, checked in the clone before anything is
	// written.
	treeish := commit + "^{tree}"
	if sub != "" {
		treeish = commit + ":" + sub
	}
	dfPath := path.Join(sub, dockerfile)
	types, err := objectTypes(ctx, cache, treeish, commit+":"+dfPath)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", "", cerr
		}
		return "", "", classified(ErrInfra, "reading the clone of "+src.Repo, err)
	}
	if types[0] != "tree" {
		return "", "", classified(ErrSource, fmt.Sprintf("path %q is not a directory in %s at %s", src.Path, src.Repo, short(commit)), nil)
	}
	if types[1] != "blob" {
		return "", "", classified(ErrSource, fmt.Sprintf("Dockerfile %q not found in %s at %s", dfPath, src.Repo, short(commit)), nil)
	}

	workRoot := filepath.Join(root, "work")
	if err := os.MkdirAll(workRoot, 0o755); err != nil {
		return "", "", classified(ErrInfra, "workspace", err)
	}
	work, err := os.MkdirTemp(workRoot, "ask-")
	if err != nil {
		return "", "", classified(ErrInfra, "workspace", err)
	}
	tree := filepath.Join(work, "context")
	if err := os.Mkdir(tree, 0o755); err != nil {
		os.RemoveAll(work)
		return "", "", classified(ErrInfra, "workspace", err)
	}
	// The tree is written from `git archive` in one git process; the
	// clone's index and work tree (it has none) are never touched.
	if err := extractTree(ctx, cache, treeish, tree); err != nil {
		os.RemoveAll(work)
		if cerr := ctx.Err(); cerr != nil {
			return "", "", cerr
		}
		return "", "", classified(ErrInfra, "checking out "+short(commit), err)
	}
	return tree, commit, nil
}

// Release removes a directory Checkout returned.
func (s *Sources) Release(dir string) error {
	root, err := s.root()
	if err != nil {
		return err
	}
	work := filepath.Dir(filepath.Clean(dir))
	if filepath.Base(dir) != "context" || filepath.Dir(work) != filepath.Join(root, "work") {
		return fmt.Errorf("sources: %s is not a checkout of %s", dir, s.Dir)
	}
	return os.RemoveAll(work)
}

func (s *Sources) root() (string, error) {
	if s.Dir == "" {
		return "", errors.New("sources: Dir is not set")
	}
	return filepath.Abs(s.Dir)
}

// checkSource refuses what git must never be handed, and returns the
// cleaned path and Dockerfile name.
func checkSource(src mesh.Source) (sub, dockerfile string, err error) {
	bad := func(field, why string) error {
		return classified(ErrSource, fmt.Sprintf("source.%s %s", field, why), nil)
	}
	if src.Repo == "" || strings.HasPrefix(src.Repo, "-") {
		return "", "", bad("repo", fmt.Sprintf("%q is not a repository", src.Repo))
	}
	if !commitRE.MatchString(src.Commit) || strings.Contains(src.Commit, "..") {
		return "", "", bad("commit", fmt.Sprintf("%q is not a commit", src.Commit))
	}
	sub, ok := relPath(src.Path)
	if !ok {
		return "", "", bad("path", fmt.Sprintf("%q leaves the repository", src.Path))
	}
	dockerfile = src.Dockerfile
	if dockerfile == "" {
		dockerfile = "Dockerfile"
	}
	dockerfile, ok = relPath(dockerfile)
	if !ok || dockerfile == "" {
		return "", "", bad("dockerfile", fmt.Sprintf("%q is not a file in the build context", src.Dockerfile))
	}
	return sub, dockerfile, nil
}

// relPath cleans a slash-separated path relative to a root ("" for the
// root itself); ok is false for an absolute path or one with "..".
func relPath(p string) (string, bool) {
	p = strings.TrimSpace(p)
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", false
		}
	}
	if path.IsAbs(p) {
		return "", false
	}
	if c := path.Clean(p); c != "." {
		return c, true
	}
	return "", true
}

// rewrite applies InsteadOf, the longest matching prefix first.
func (s *Sources) rewrite(repo string) string {
	keys := make([]string, 0, len(s.InsteadOf))
	for k := range s.InsteadOf {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for _, k := range keys {
		if k != "" && strings.HasPrefix(repo, k) {
			return s.InsteadOf[k] + strings.TrimPrefix(repo, k)
		}
	}
	return repo
}

func (s *Sources) lock(cache string) func() {
	s.mu.Lock()
	if s.repos == nil {
		s.repos = map[string]*sync.Mutex{}
	}
	m, ok := s.repos[cache]
	if !ok {
		m = &sync.Mutex{}
		s.repos[cache] = m
	}
	s.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// fetch makes sure the clone at cache holds src.Commit and returns its full
// hash.
func (s *Sources) fetch(ctx context.Context, cache, url string, src mesh.Source) (string, error) {
	unlock := s.lock(cache)
	defer unlock()

	if _, err := os.Stat(filepath.Join(cache, "HEAD")); err != nil {
		if err := initClone(ctx, cache); err != nil {
			return "", err
		}
	}
	if s.originOf(cache) != url {
		if _, err := git(ctx, cache, nil, "config", "remote.origin.url", url); err != nil {
			return "", classified(ErrInfra, "configuring the clone of "+src.Repo, err)
		}
		s.setOrigin(cache, url)
	}

	full := fullHashRE.MatchString(src.Commit)
	if full {
		if c, err := resolveCommit(ctx, cache, src.Commit); err == nil {
			return c, nil
		}
		// Most servers hand out a reachable commit by its hash.
		if _, err := git(ctx, cache, nil, "fetch", "--quiet", "--no-tags", "origin", src.Commit); err == nil {
			if c, err := resolveCommit(ctx, cache, src.Commit); err == nil {
				return c, nil
			}
		} else if cerr := ctx.Err(); cerr != nil {
			return "", cerr
		}
	}
	// HEAD is the server's: fetched on its own and read from FETCH_HEAD
	// (under the clone's lock), never the bare clone's own HEAD.
	if src.Commit == "HEAD" {
		if _, err := git(ctx, cache, nil, "fetch", "--quiet", "--no-tags", "origin", "HEAD"); err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return "", cerr
			}
			return "", fetchError(src.Repo, url, err)
		}
		c, err := resolveCommit(ctx, cache, "FETCH_HEAD")
		if err != nil {
			return "", classified(ErrSource, fmt.Sprintf("%s has no HEAD", src.Repo), err)
		}
		return c, nil
	}
	// Every branch and tag: for a server that will not hand out a hash, and
	// for a commit named by a ref (always fetched anew: refs move).
	if _, err := git(ctx, cache, nil, "fetch", "--quiet", "--prune", "--force", "origin",
		"+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", cerr
		}
		return "", fetchError(src.Repo, url, err)
	}
	c, err := resolveCommit(ctx, cache, src.Commit)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", cerr
		}
		return "", classified(ErrSource, fmt.Sprintf("commit %s not found in %s", src.Commit, src.Repo), err)
	}
	return c, nil
}

// initClone creates an empty bare clone at cache, atomically.
func initClone(ctx context.Context, cache string) error {
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
		return classified(ErrInfra, "creating the clone", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(cache), ".init-")
	if err != nil {
		return classified(ErrInfra, "creating the clone", err)
	}
	if _, err := git(ctx, "", nil, "init", "--quiet", "--bare", tmp); err != nil {
		os.RemoveAll(tmp)
		return classified(ErrInfra, "creating the clone", err)
	}
	if err := os.Rename(tmp, cache); err != nil {
		os.RemoveAll(tmp)
		return classified(ErrInfra, "creating the clone", err)
	}
	return nil
}

func resolveCommit(ctx context.Context, cache, commit string) (string, error) {
	return git(ctx, cache, nil, "rev-parse", "--verify", "--quiet", "--end-of-options", commit+"^{commit}")
}

// fetchError classifies a failed fetch of every ref. A local repository that
// exists but will not fetch is not a repository (source). For a remote one,
// git's exit status says nothing more, so its message decides: the
// server's "not found" is a source failure, anything else (refused,
// unresolvable, timed out, 5xx) infrastructure.
func fetchError(repo, url string, err error) error {
	if p, local := localPath(url); local {
		if _, serr := os.Stat(p); serr != nil {
			return classified(ErrSource, fmt.Sprintf("repository %s not found", repo), err)
		}
		return classified(ErrSource, fmt.Sprintf("repository %s is not a git repository", repo), err)
	}
	var ge *gitError
	if errors.As(err, &ge) {
		msg := strings.ToLower(ge.stderr)
		for _, s := range []string{"not found", "does not exist", "does not appear to be a git repository", "404"} {
			if strings.Contains(msg, s) {
				return classified(ErrSource, fmt.Sprintf("repository %s not found", repo), err)
			}
		}
	}
	return classified(ErrInfra, "fetching "+repo, err)
}

// localPath reports whether url names a repository on this machine, and its
// path.
func localPath(url string) (string, bool) {
	if p, ok := strings.CutPrefix(url, "file://"); ok {
		return p, true
	}
	if strings.Contains(url, "://") {
		return "", false
	}
	// scp-like host:path, unless the colon comes after a slash.
	if i := strings.IndexByte(url, ':'); i >= 0 && !strings.Contains(url[:i], "/") {
		return "", false
	}
	return url, true
}

// gitError is a failed git command with what it said.
type gitError struct {
	args   []string
	err    error
	stderr string
}

func (e *gitError) Error() string {
	msg := lastLine(e.stderr)
	if msg == "" {
		msg = e.err.Error()
	}
	return fmt.Sprintf("git %s: %s", strings.Join(e.args, " "), msg)
}

func (e *gitError) Unwrap() error { return e.err }

// git runs git against the repository at gitDir ("" for none) and returns
// its trimmed output. It never prompts for credentials.
func git(ctx context.Context, gitDir string, env []string, args ...string) (string, error) {
	full := args
	if gitDir != "" {
		full = append([]string{"--git-dir=" + gitDir}, args...)
	}
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", &gitError{args: args, err: err, stderr: stderr.String()}
	}
	return strings.TrimSpace(stdout.String()), nil
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

// objectTypes asks the clone for the type of each object name in one git
// process: "tree", "blob", "commit", or "missing".
func objectTypes(ctx context.Context, cache string, names ...string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "git", "--git-dir="+cache, "cat-file", "--batch-check=%(objecttype)")
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, &gitError{args: []string{"cat-file", "--batch-check"}, err: err, stderr: stderr.String()}
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(names) {
		return nil, fmt.Errorf("git cat-file answered %d lines for %d names", len(lines), len(names))
	}
	types := make([]string, len(lines))
	for i, l := range lines {
		types[i] = "missing"
		if f := strings.Fields(l); len(f) == 1 && f[0] != "missing" {
			types[i] = f[0]
		}
	}
	return types, nil
}

func (s *Sources) originOf(cache string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.origin[cache]
}

func (s *Sources) setOrigin(cache, url string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.origin == nil {
		s.origin = map[string]string{}
	}
	s.origin[cache] = url
}

// extractTree writes the tree treeish of the clone into dir (which exists),
// from `git archive`: regular files with their executable bit, directories
// and symbolic links, as git stores them.
func extractTree(ctx context.Context, cache, treeish, dir string) error {
	cmd := exec.CommandContext(ctx, "git", "--git-dir="+cache, "archive", "--format=tar", treeish)
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	rerr := untar(out, dir)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return &gitError{args: []string{"archive", treeish}, err: err, stderr: stderr.String()}
	}
	return rerr
}

func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean(h.Name)
		if name == "." || path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			continue
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			mode := os.FileMode(0o644)
			if h.Mode&0o111 != 0 {
				mode = 0o755
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}
