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
	"time"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/mesh"
)

// Sources checks out asks' build contexts. It keeps one bare clone per
// repository under Dir/repos (a gitcache.Cache: named by a hash of the
// repository's URL as the ask spells it), fetches into it only when the
// commit is not there yet, and then only that commit (a shallow fetch: a
// machine's first build of a repository is not sent its history), and
// writes each tree it checks out once, to its own directory under
// Dir/work (trees.go): slots building the same repository at once share
// the clone, and the builds of one tree its checkout, which they only
// read. Fetches into one clone are serialised; checkouts read it
// concurrently. The git command line does the work.
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
	// KeepTrees is how many released checkouts are kept on disk for the
	// next build of the same tree (trees.go): 0 is DefaultKeepTrees, a
	// negative number none (each removed when its build releases it).
	KeepTrees int
	// MinFree is the free space the workspace's file system needs for the
	// machine to take an ask (Probe; DefaultMinFree is build-agent's
	// default): 0 checks none.
	MinFree int64

	trees    trees
	resolved sync.Map // resolution by repository, commit, path and Dockerfile
	// notes are what each tree written holds that its build's log says
	// (Submodules, LFSPointers), by tree id, for those that hold any.
	notes sync.Map
	once  sync.Once
	cache *gitcache.Cache
}

// clones is the cache of bare clones under Dir/repos, made on first use.
func (s *Sources) clones(root string) *gitcache.Cache {
	s.once.Do(func() {
		// Shallow: a build needs its commit's tree, not the history.
		s.cache = &gitcache.Cache{Dir: filepath.Join(root, "repos"), InsteadOf: s.InsteadOf, Depth: 1}
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
	cache, commit, id, err := s.resolve(ctx, root, src, sub, dockerfile)
	if err != nil {
		return "", "", err
	}
	// The tree by its name: the commit's objects need not be in the clone
	// (heldTree). Its files' times are then the checkout's, which neither
	// BuildKit's cache keys nor the image (its times rewritten) record.
	// Written once for every build of the same tree (writeTree).
	t, err := s.writeTree(ctx, root, cache, id, "checking out "+short(commit), src.Repo, commit, sub)
	if err != nil {
		// What the clone was found to hold is looked at again next time.
		s.resolved.Delete(resolveKey(src, sub, dockerfile))
		return "", "", err
	}
	return t.dir, commit, nil
}

// Submodule is a git submodule in a checkout: its path relative to the
// checkout, the commit it pins, and the url it was fetched from (resolved
// from the .gitmodules of the repository that holds it); URL is "" for a
// gitlink .gitmodules gives no url for, whose directory is left empty.
type Submodule struct {
	Path, URL, Commit string
}

// notes are what a checkout holds that its build's log says: its
// submodules, and the Git LFS pointers in it and in them.
type notes struct {
	submodules []Submodule
	lfs        []string
}

// notesOf are the notes of the checkout dir (as Checkout or DockerfileDir
// returned it).
func (s *Sources) notesOf(dir string) notes {
	t, ok := s.trees.byDir(filepath.Clean(dir))
	if !ok {
		return notes{}
	}
	n, _ := s.notes.Load(t.id)
	out, _ := n.(notes)
	return out
}

// Submodules are the git submodules in the checkout dir (as Checkout or
// DockerfileDir returned it), nested ones too, relative to it: each is
// fetched (at the commit its gitlink pins, from the url .gitmodules gives,
// a relative one resolved against the repository's, and rewritten by
// InsteadOf) and written into its directory, as docker build of a git
// context writes them, unless .gitmodules names no url for it. The worker
// says each in the build's log.
func (s *Sources) Submodules(dir string) []Submodule { return s.notesOf(dir).submodules }

// LFSPointers are the files of the checkout dir, relative to it, that are
// Git LFS pointers: git stores a pointer in place of a file tracked by
// Git LFS, and the object it names is not fetched (docker build of a git
// context does not fetch it either), so a build that copies the file gets
// the pointer's text. The worker says so in the build's log.
func (s *Sources) LFSPointers(dir string) []string { return s.notesOf(dir).lfs }

// DockerfileDir writes the directory that holds src's Dockerfile, when it
// lies outside the build context (mesh.DockerfileOutside), as it is at
// commit (the full hash CheckoutCommit returned, which fetched it), and
// returns it: the build's Dockerfile mount, as `docker build -f` mounts
// the Dockerfile's directory. It returns "" for a Dockerfile in the
// context. Release the directory as Checkout's.
func (s *Sources) DockerfileDir(ctx context.Context, src mesh.Source, commit string) (string, error) {
	sub, dockerfile, err := checkSource(src)
	if err != nil {
		return "", err
	}
	dir, outside := mesh.DockerfileOutside(sub, dockerfile)
	if !outside {
		return "", nil
	}
	root, err := s.root()
	if err != nil {
		return "", err
	}
	if !gitcache.FullHash(commit) {
		return "", fmt.Errorf("sources: the Dockerfile's directory of %s is read at a full commit hash, not %q", src.Repo, commit)
	}
	clone, err := s.clones(root).Clone(src.Repo)
	if err != nil {
		return "", classified(ErrInfra, saying("the clone of "+src.Repo, err), err)
	}
	objs, err := gitcache.Objects(ctx, clone, gitcache.TreeName(commit, dir))
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", cerr
		}
		return "", classified(ErrInfra, saying("reading the clone of "+src.Repo, err), err)
	}
	if objs[0].Type != "tree" {
		return "", classified(ErrSource, fmt.Sprintf("the Dockerfile's directory %q is not a directory in %s at %s", dir, src.Repo, short(commit)), nil)
	}
	id := objs[0].ID
	t, err := s.writeTree(ctx, root, clone, id, "checking out the Dockerfile's directory at "+short(commit), src.Repo, commit, dir)
	if err != nil {
		return "", err
	}
	return t.dir, nil
}

// writeTree takes the checkout of tree id of clone, written from `git
// archive` in one git process (the clone's index and work tree, it has
// none, are never touched) when it is not on disk: once for every build
// of the same tree (trees.go). The tree is at path sub of commit in repo,
// whose .gitmodules names the url of each submodule in it: they are
// written in too (writeCheckout). doing names the work in a failure's
// message.
func (s *Sources) writeTree(ctx context.Context, root, clone, id, doing, repo, commit, sub string) (*tree, error) {
	return s.trees.take(ctx, filepath.Join(root, "work"), id, func(dir string) error {
		n, err := s.writeCheckout(ctx, root, clone, id, repo, commit, sub, dir, 0, doing)
		if err != nil {
			return err
		}
		if len(n.submodules)+len(n.lfs) > 0 {
			s.notes.Store(id, n)
		}
		return nil
	})
}

// gitFailure is a git command's failure while doing: the context's end,
// or infrastructure (the clone could not be read or written).
func gitFailure(ctx context.Context, doing string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return classified(ErrInfra, saying(doing, err), err)
}

// saidOf is err, a classified failure, with its message begun by what
// (which submodule it is of); any other error as it is.
func saidOf(what string, err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	return classified(e.Kind, what+e.Msg, e.Err)
}

// maxSubmoduleDepth bounds submodules within submodules.
const maxSubmoduleDepth = 8

// writeCheckout writes the tree treeish of clone — the tree at path sub of
// commit in repo — into dir, and into the directory of each submodule in
// it (which git archive writes empty) the submodule's own tree, written so
// in turn: its url read from commit's .gitmodules and resolved against
// repo (submoduleURL), its pinned commit fetched into that url's own clone
// (shallow, as every fetch here). depth is the nesting, 0 for a build's
// checkout. It returns what the build's log says of them, relative to dir.
// A gitlink .gitmodules gives no url for is left empty, as git leaves it.
// A url or commit that is not there fails the checkout as a source error
// naming the submodule; a server that cannot be reached, as
// infrastructure.
func (s *Sources) writeCheckout(ctx context.Context, root, clone, treeish, repo, commit, sub, dir string, depth int, doing string) (notes, error) {
	w, err := gitcache.Archive(ctx, clone, treeish, dir)
	if err != nil {
		return notes{}, gitFailure(ctx, doing, err)
	}
	n := notes{lfs: w.LFS}
	if len(w.Empty) == 0 {
		return n, nil // no submodule: git writes one as an empty directory
	}
	links, err := gitcache.Gitlinks(ctx, clone, treeish)
	if err != nil {
		return n, gitFailure(ctx, doing, err)
	}
	if len(links) == 0 {
		return n, nil
	}
	if depth >= maxSubmoduleDepth {
		return n, classified(ErrSource, fmt.Sprintf("submodules in %s nest deeper than %d", repo, maxSubmoduleDepth), nil)
	}
	// The commit's .gitmodules: the clone may hold the context's tree
	// without the commit (heldTree), which is then fetched.
	clone, full, err := s.fetch(ctx, root, mesh.Source{Repo: repo, Commit: commit})
	if err != nil {
		return n, err
	}
	urls, err := gitcache.SubmoduleURLs(ctx, clone, full)
	if err != nil {
		return n, gitFailure(ctx, "reading .gitmodules of "+repo+" at "+short(full), err)
	}
	for _, l := range links {
		u, ok := urls[path.Join(sub, l.Path)]
		if !ok {
			n.submodules = append(n.submodules, Submodule{Path: l.Path, Commit: l.Commit})
			continue
		}
		bad := func(why string) error {
			return classified(ErrSource, fmt.Sprintf("submodule %s (%s in .gitmodules of %s): %s", l.Path, u, repo, why), nil)
		}
		url, err := s.submoduleURL(root, repo, u)
		if err != nil {
			return n, bad(err.Error())
		}
		if why := refusedURL(s.clones(root), repo, url); why != "" {
			return n, bad(why)
		}
		subClone, subCommit, err := s.fetch(ctx, root, mesh.Source{Repo: url, Commit: l.Commit})
		if err != nil {
			return n, saidOf("submodule "+l.Path+": ", err)
		}
		inner, err := s.writeCheckout(ctx, root, subClone, subCommit+"^{tree}", url, subCommit, "",
			filepath.Join(dir, filepath.FromSlash(l.Path)), depth+1, "checking out "+short(subCommit))
		if err != nil {
			return n, saidOf("in submodule "+l.Path+": ", err)
		}
		n.submodules = append(n.submodules, Submodule{Path: l.Path, URL: url, Commit: subCommit})
		for _, m := range inner.submodules {
			m.Path = path.Join(l.Path, m.Path)
			n.submodules = append(n.submodules, m)
		}
		for _, f := range inner.lfs {
			n.lfs = append(n.lfs, path.Join(l.Path, f))
		}
	}
	return n, nil
}

// submoduleURL is the url a submodule's url u in .gitmodules of repo is
// fetched from: u resolved against repo as git resolves it
// (gitcache.ResolveURL). A relative one that no InsteadOf rewrites, of a
// repository fetched from a mirror on this machine (rewritten to a local
// path), is the mirror's sibling when that is there: the operator who
// mirrors https://git.example/fleet.git to /srv/git/fleet mirrors its
// "../lib.git" to /srv/git/lib.git beside it, not to a url of its own.
func (s *Sources) submoduleURL(root, repo, u string) (string, error) {
	url, err := gitcache.ResolveURL(repo, u)
	if err != nil || url == u {
		return url, err
	}
	c := s.clones(root)
	mirror := c.Rewrite(repo)
	if c.Rewrite(url) != url || mirror == repo {
		return url, nil
	}
	if _, local := localPath(mirror); !local {
		return url, nil
	}
	beside, err := gitcache.ResolveURL(mirror, u)
	if err != nil {
		return url, nil
	}
	if p, _ := localPath(beside); p != "" {
		if _, err := os.Stat(p); err == nil {
			return beside, nil
		}
	}
	return url, nil
}

// refusedURL says why a submodule's url (resolved) of the repository repo
// is not fetched by c, "" if it is: a transport that runs a program
// (transport::address, such as ext::), and a path on this machine unless
// repo is fetched from this machine too (as rewritten by InsteadOf) — a
// repository's .gitmodules must not read the machine's own files into an
// image, as git refuses a local submodule since 2.38.1 (CVE-2022-39253).
func refusedURL(c *gitcache.Cache, repo, url string) string {
	if i := strings.Index(url, "::"); i >= 0 && !strings.ContainsAny(url[:i], "/:") {
		return "a url through a remote helper is not fetched"
	}
	if strings.HasPrefix(url, "-") {
		return "not a url"
	}
	if _, local := localPath(url); local {
		if _, superLocal := localPath(c.Rewrite(repo)); !superLocal {
			return "a path on the building machine is fetched only for a repository fetched from this machine"
		}
	}
	return ""
}

// resolve makes sure the clone holds src's commit and finds the tree of
// its context path, checking that the path is a directory and the
// Dockerfile a file in it before anything is written. A full commit hash
// and what it holds never change, so what was found for one is used again
// for a while (resolvedFor) without asking git.
func (s *Sources) resolve(ctx context.Context, root string, src mesh.Source, sub, dockerfile string) (clone, commit, tree string, err error) {
	dfPath := path.Join(sub, dockerfile)
	key := resolveKey(src, sub, dockerfile)
	if r, ok := s.resolved.Load(key); ok && time.Since(r.(resolution).at) < resolvedFor {
		r := r.(resolution)
		return r.clone, r.commit, r.tree, nil
	}
	// A Dockerfile beside the context is not in the context's tree: the
	// commit is read for it.
	if _, outside := mesh.DockerfileOutside(sub, dockerfile); !outside {
		if clone, ok := s.heldTree(ctx, root, src, dockerfile); ok {
			s.resolved.Store(key, resolution{clone: clone, commit: src.Commit, tree: src.Tree, at: time.Now()})
			return clone, src.Commit, src.Tree, nil
		}
	}
	clone, commit, err = s.fetch(ctx, root, src)
	if err != nil {
		return "", "", "", err
	}
	objs, err := gitcache.Objects(ctx, clone, gitcache.TreeName(commit, sub), commit+":"+dfPath)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", "", "", cerr
		}
		return "", "", "", classified(ErrInfra, saying("reading the clone of "+src.Repo, err), err)
	}
	if objs[0].Type != "tree" {
		return "", "", "", classified(ErrSource, fmt.Sprintf("path %q is not a directory in %s at %s", src.Path, src.Repo, short(commit)), nil)
	}
	if objs[1].Type != "blob" {
		return "", "", "", classified(ErrSource, fmt.Sprintf("Dockerfile %q not found in %s at %s", dfPath, src.Repo, short(commit)), nil)
	}
	if src.Tree != "" && objs[0].ID != src.Tree {
		return "", "", "", classified(ErrSource, fmt.Sprintf("path %q in %s at %s is tree %s, and the ask names tree %s", src.Path, src.Repo, short(commit), objs[0].ID, src.Tree), nil)
	}
	if src.Commit == commit { // a full hash, not a ref that may move
		s.resolved.Store(key, resolution{clone: clone, commit: commit, tree: objs[0].ID, at: time.Now()})
	}
	return clone, commit, objs[0].ID, nil
}

// heldTree reports whether the clone of src's repository holds the tree
// the ask names for its context (src.Tree, read by the controller at
// src.Commit) with the Dockerfile in it: then the build needs nothing
// from the commit, and the commit is not fetched. A new commit that left
// the module's own sources as they were (a change to its base, a forced
// rebuild) is built from what the clone holds. Git names a tree by its
// content, and a fetch stores whole packs, so a tree the clone holds is
// the tree the ask names, all of it.
func (s *Sources) heldTree(ctx context.Context, root string, src mesh.Source, dockerfile string) (string, bool) {
	if src.Tree == "" || !gitcache.FullHash(src.Commit) || !gitcache.FullHash(src.Tree) {
		return "", false
	}
	clone, err := s.clones(root).Clone(src.Repo)
	if err != nil {
		return "", false
	}
	if _, err := os.Stat(filepath.Join(clone, "HEAD")); err != nil {
		return "", false
	}
	objs, err := gitcache.Objects(ctx, clone, src.Tree, src.Tree+":"+dockerfile)
	if err != nil || objs[0].Type != "tree" || objs[0].ID != src.Tree || objs[1].Type != "blob" {
		return "", false
	}
	return clone, true
}

// resolveKey is what a resolution is kept under.
func resolveKey(src mesh.Source, sub, dockerfile string) string {
	return src.Repo + "\x00" + src.Commit + "\x00" + sub + "\x00" + dockerfile
}

// resolution is what resolve found for a full commit hash, and when.
type resolution struct {
	clone, commit, tree string
	at                  time.Time
}

// resolvedFor is how long a resolution is used again: a commit fetched by
// its hash and reachable from no ref may be pruned from the clone by
// git's own garbage collection, weeks later; what was found is asked of
// git again well before.
const resolvedFor = 10 * time.Minute

// Release ends the build's use of a directory Checkout returned: the
// checkout is kept for the next build of the same tree, the KeepTrees most
// recently released ones, and the others removed.
func (s *Sources) Release(dir string) error {
	t, ok := s.trees.byDir(filepath.Clean(dir))
	if !ok {
		return fmt.Errorf("sources: %s is not a checkout of %s in use", dir, s.Dir)
	}
	return s.trees.give(t, s.keep())
}

// keep is how many released checkouts are kept (KeepTrees, its default).
func (s *Sources) keep() int {
	switch {
	case s.KeepTrees == 0:
		return DefaultKeepTrees
	case s.KeepTrees < 0:
		return 0
	}
	return s.KeepTrees
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
	if _, outside := mesh.DockerfileOutside(sub, dockerfile); outside {
		// Beside the context, in the repository (DockerfileDir checks
		// its directory out).
		if full, ok := relPath(path.Join(sub, dockerfile)); !ok || full == "" {
			return "", "", bad("dockerfile", fmt.Sprintf("%q leaves the repository", src.Dockerfile))
		}
		return sub, path.Clean(strings.TrimSpace(dockerfile)), nil
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
// reached, ErrInfra. So is a repository or commit missing from this
// machine's own mirror of it (a rewrite of Sources.InsteadOf) when the
// controller read the commit (the ask names its tree): the mirror is this
// machine's, and another machine may build the ask.
func (s *Sources) fetch(ctx context.Context, root string, src mesh.Source) (clone, commit string, err error) {
	c := s.clones(root)
	clone, commit, err = c.Fetch(ctx, src.Repo, src.Commit)
	switch {
	case err == nil:
		return clone, commit, nil
	case ctx.Err() != nil:
		return "", "", ctx.Err()
	}
	if why, ok := localFailure(err); ok {
		// This machine's disk, not the source: neither "not found" nor
		// the mirror's trouble, whatever the fetch left behind.
		return "", "", s.localError(src.Repo, why, err)
	}
	url := c.Rewrite(src.Repo)
	failure := fetchFailure(src, url, err)
	if errors.Is(failure, ErrSource) && url != src.Repo && src.Tree != "" {
		// This machine fetches the repository from its own mirror
		// (--git-instead-of), and the controller read this commit (the
		// ask names its tree): what the mirror lacks, another machine
		// may well have — one machine's mirror must not fail the ask.
		return "", "", classified(ErrInfra, fmt.Sprintf("%s at %s: not found in this machine's mirror of it, %s (--git-instead-of)",
			src.Repo, short(src.Commit), url), err)
	}
	return "", "", failure
}

// fetchFailure classifies a failed fetch of src from url.
func fetchFailure(src mesh.Source, url string, err error) error {
	switch {
	case errors.Is(err, gitcache.ErrFetch):
		return fetchError(src.Repo, url, err)
	case errors.Is(err, gitcache.ErrNotFound) && src.Commit == "HEAD":
		return classified(ErrSource, fmt.Sprintf("%s has no HEAD", src.Repo), err)
	case errors.Is(err, gitcache.ErrNotFound):
		return classified(ErrSource, fmt.Sprintf("commit %s not found in %s", src.Commit, src.Repo), err)
	}
	return classified(ErrInfra, saying("preparing the clone of "+src.Repo, err), err)
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
	return classified(ErrInfra, saying("fetching "+repo, err), err)
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
