package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/mesh"
)

// Sources checks out asks' build contexts. It keeps one bare clone per
// repository under Dir/repos (a gitcache.Cache: named by a hash of the
// repository's URL as the ask spells it), fetches into it only when the
// commit is not there
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

	once  sync.Once
	cache *gitcache.Cache
}

// clones is the cache of bare clones under Dir/repos, made on first use.
func (s *Sources) clones(root string) *gitcache.Cache {
	s.once.Do(func() {
		s.cache = &gitcache.Cache{Dir: filepath.Join(root, "repos"), InsteadOf: s.InsteadOf}
	})
	return s.cache
}

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
	cache, commit, err := s.fetch(ctx, root, src)
	if err != nil {
		return "", "", err
	}

	// The path and the Dockerfile, checked in the clone before anything is
	// written.
	treeish := gitcache.TreeName(commit, sub)
	dfPath := path.Join(sub, dockerfile)
	objs, err := gitcache.Objects(ctx, cache, treeish, commit+":"+dfPath)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", "", cerr
		}
		return "", "", classified(ErrInfra, "reading the clone of "+src.Repo, err)
	}
	if objs[0].Type != "tree" {
		return "", "", classified(ErrSource, fmt.Sprintf("path %q is not a directory in %s at %s", src.Path, src.Repo, short(commit)), nil)
	}
	if objs[1].Type != "blob" {
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
	if err := gitcache.Archive(ctx, cache, treeish, tree); err != nil {
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
	if !gitcache.ValidRepo(src.Repo) {
		return "", "", bad("repo", fmt.Sprintf("%q is not a repository", src.Repo))
	}
	if !gitcache.ValidCommit(src.Commit) {
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

// fetch makes sure the clone of src.Repo holds src.Commit and returns the
// clone and the commit's full hash, the failure classified: a repository
// or commit that is not there is ErrSource; a git server that cannot be
// reached, ErrInfra.
func (s *Sources) fetch(ctx context.Context, root string, src mesh.Source) (clone, commit string, err error) {
	c := s.clones(root)
	clone, commit, err = c.Fetch(ctx, src.Repo, src.Commit)
	switch {
	case err == nil:
		return clone, commit, nil
	case ctx.Err() != nil:
		return "", "", ctx.Err()
	case errors.Is(err, gitcache.ErrFetch):
		return "", "", fetchError(src.Repo, c.Rewrite(src.Repo), err)
	case errors.Is(err, gitcache.ErrNotFound) && src.Commit == "HEAD":
		return "", "", classified(ErrSource, fmt.Sprintf("%s has no HEAD", src.Repo), err)
	case errors.Is(err, gitcache.ErrNotFound):
		return "", "", classified(ErrSource, fmt.Sprintf("commit %s not found in %s", src.Commit, src.Repo), err)
	}
	return "", "", classified(ErrInfra, "preparing the clone of "+src.Repo, err)
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
	var ge *gitcache.Error
	if errors.As(err, &ge) {
		msg := strings.ToLower(ge.Stderr)
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

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}
