// Package gitcache keeps bare clones of git repositories, one per
// repository under a directory, and fetches into a clone only what it
// lacks: a commit named by its full hash that the clone has is never
// fetched again; a ref (HEAD, a branch, a tag) is always fetched anew,
// since refs move. The agent checks build contexts out of these clones
// (Archive); the controller reads tree ids from them (Resolve, Changed).
//
// A clone is named by a hash of the repository's URL as the caller spells
// it; InsteadOf (git's url.<base>.insteadOf) rewrites the URL it is fetched
// from. Fetches into one clone are serialised; reads run concurrently. The
// git command line does the work and never prompts for credentials.
//
//	c := &gitcache.Cache{Dir: "/var/lib/meshbuild/controller/repos"}
//	res, err := c.Resolve(ctx, "https://git.example/fleet.git", "HEAD", []string{"base", "runtime"})
//	// res.Commit is HEAD's full hash; res.Trees["base"] its tree id at base/
//	// ("" when the commit has no such directory).
package gitcache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

var (
	// ErrNotFound is wrapped when the repository has no such commit (or,
	// for HEAD, no HEAD).
	ErrNotFound = errors.New("commit not found")
	// ErrFetch is wrapped when fetching from the repository failed: the
	// error also wraps the *Error of the git command.
	ErrFetch = errors.New("fetch failed")
)

// Cache keeps bare clones under Dir. Set Dir; the rest of the zero value is
// ready. It is safe for concurrent use, not by two processes sharing Dir.
type Cache struct {
	// Dir holds the bare clones.
	Dir string
	// InsteadOf rewrites repository URLs before they are fetched: a repo
	// starting with a key is fetched from the value followed by the rest
	// (the longest key wins).
	InsteadOf map[string]string
	// Depth, when positive, fetches only the last Depth commits of what
	// is fetched (git fetch --depth): a builder needs a commit's tree, not
	// its history, and a fresh machine's first fetch of a repository with
	// years of history is sent one tree instead of every object ever
	// committed. A commit named by a ref the server will not hand out by
	// hash is looked for in the whole history (the clone unshallowed).
	// Changed needs the history between two commits: 0, the whole history,
	// for a cache that compares commits.
	Depth int

	mu    sync.Mutex
	locks map[string]chan struct{} // each clone's lock: held while it has its one token
	// origin is the URL each clone's origin was last set to (under the
	// clone's lock), so that it is set only when it changes.
	origin map[string]string
}

var (
	// A commit is a hash or a ref name; never an option.
	commitRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
)

// FetchedRef is the clone's ref to the last commit fetched by its hash: it
// keeps that commit's objects reachable and is offered to the server as
// held on the next fetch, which is then sent only the objects new since.
const FetchedRef = "refs/meshbuild/fetched"

// FullHash reports whether commit is a full object name (SHA-1 or
// SHA-256), which names the same commit for ever: a clone that has it
// need not fetch.
func FullHash(commit string) bool { return mesh.GitObjectName(commit) }

// ValidRepo reports whether repo may be handed to git as a repository.
func ValidRepo(repo string) bool { return repo != "" && !strings.HasPrefix(repo, "-") }

// ValidCommit reports whether commit may be handed to git: a hash or a ref
// name, never an option or a range.
func ValidCommit(commit string) bool {
	return commitRE.MatchString(commit) && !strings.Contains(commit, "..")
}

// Clone is the directory of repo's bare clone (which may not exist yet).
func (c *Cache) Clone(repo string) (string, error) {
	if c.Dir == "" {
		return "", errors.New("gitcache: Dir is not set")
	}
	root, err := filepath.Abs(c.Dir)
	if err != nil {
		return "", err
	}
	key := sha256.Sum256([]byte(repo))
	return filepath.Join(root, hex.EncodeToString(key[:12])+".git"), nil
}

// Fetch makes sure repo's clone holds commit (a full hash, a ref name, or
// HEAD: the server's) and returns the clone and the commit's full hash. A
// commit the repository does not have wraps ErrNotFound; a failed fetch,
// ErrFetch; when ctx ends, its error is returned.
func (c *Cache) Fetch(ctx context.Context, repo, commit string) (clone, full string, err error) {
	if !ValidRepo(repo) {
		return "", "", fmt.Errorf("gitcache: %q is not a repository", repo)
	}
	if !ValidCommit(commit) {
		return "", "", fmt.Errorf("gitcache: %q is not a commit", commit)
	}
	if clone, err = c.Clone(repo); err != nil {
		return "", "", err
	}
	// A commit the clone holds is read without the clone's lock: git's
	// readers are safe beside a fetch, which may hold the lock for long
	// (a push's commit fetched beside the controller's loop), and a
	// rebuild of a module at the commit it was built from waits for none.
	if FullHash(commit) {
		if _, err := os.Stat(filepath.Join(clone, "HEAD")); err == nil {
			if h, err := revParse(ctx, clone, commit); err == nil {
				return clone, h, nil
			}
		}
	}
	unlock, err := c.lock(ctx, clone)
	if err != nil {
		return "", "", err
	}
	defer unlock()
	if err := c.prepare(ctx, clone, c.Rewrite(repo)); err != nil {
		return "", "", err
	}
	full, err = fetch(ctx, clone, commit, c.Depth)
	if cerr := ctx.Err(); err != nil && cerr != nil {
		return "", "", cerr
	}
	return clone, full, err
}

// prepare creates the clone if it is not there and points its origin at
// url. The caller holds the clone's lock.
func (c *Cache) prepare(ctx context.Context, clone, url string) error {
	if _, err := os.Stat(filepath.Join(clone, "HEAD")); err != nil {
		if err := initClone(ctx, clone); err != nil {
			return fmt.Errorf("creating the clone: %w", err)
		}
	}
	if c.originOf(clone) != url {
		if _, err := Git(ctx, clone, "config", "remote.origin.url", url); err != nil {
			return fmt.Errorf("configuring the clone: %w", err)
		}
		c.setOrigin(clone, url)
	}
	return nil
}

// fetch makes sure the clone holds commit and returns its full hash; depth
// > 0 fetches that many commits of history (Cache.Depth).
func fetch(ctx context.Context, clone, commit string, depth int) (string, error) {
	fetchArgs := func(args ...string) []string {
		out := []string{"fetch", "--quiet", "--no-tags"}
		if depth > 0 {
			out = append(out, fmt.Sprintf("--depth=%d", depth))
		}
		return append(out, args...)
	}
	if FullHash(commit) {
		if h, err := revParse(ctx, clone, commit); err == nil {
			return h, nil
		}
		// Most servers hand out a reachable commit by its hash. It is
		// fetched into FetchedRef, so that the next fetch tells the
		// server what the clone holds and is sent only what is new:
		// without a ref, every new commit fetched its whole history.
		if _, err := Git(ctx, clone, fetchArgs("origin", "+"+commit+":"+FetchedRef)...); err == nil {
			if h, err := revParse(ctx, clone, commit); err == nil {
				return h, nil
			}
		} else if cerr := ctx.Err(); cerr != nil {
			return "", cerr
		}
	}
	// HEAD is the server's: fetched on its own and read from FETCH_HEAD
	// (under the clone's lock), never the bare clone's own HEAD.
	if commit == "HEAD" {
		if _, err := Git(ctx, clone, fetchArgs("origin", "HEAD")...); err != nil {
			return "", fmt.Errorf("%w: %w", ErrFetch, err)
		}
		h, err := revParse(ctx, clone, "FETCH_HEAD")
		if err != nil {
			return "", fmt.Errorf("%w: no HEAD: %w", ErrNotFound, err)
		}
		return h, nil
	}
	// Every branch and tag: for a server that will not hand out a hash, and
	// for a commit named by a ref.
	refs := []string{"--prune", "--force", "origin", "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"}
	if _, err := Git(ctx, clone, fetchArgs(refs...)...); err != nil {
		return "", fmt.Errorf("%w: %w", ErrFetch, err)
	}
	h, err := revParse(ctx, clone, commit)
	if err != nil && depth > 0 && FullHash(commit) {
		// Not at a ref's tip: behind the shallow fetch's depth, perhaps.
		if _, serr := os.Stat(filepath.Join(clone, "shallow")); serr == nil {
			if _, err := Git(ctx, clone, append([]string{"fetch", "--quiet", "--no-tags", "--unshallow"}, refs...)...); err != nil {
				return "", fmt.Errorf("%w: %w", ErrFetch, err)
			}
			h, err = revParse(ctx, clone, commit)
		}
	}
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrNotFound, commit, err)
	}
	return h, nil
}

// initClone creates an empty bare clone, atomically.
func initClone(ctx context.Context, clone string) error {
	if err := os.MkdirAll(filepath.Dir(clone), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(clone), ".init-")
	if err != nil {
		return err
	}
	if _, err := Git(ctx, "", "init", "--quiet", "--bare", tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, clone); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

func revParse(ctx context.Context, clone, commit string) (string, error) {
	return Git(ctx, clone, "rev-parse", "--verify", "--quiet", "--end-of-options", commit+"^{commit}")
}

// Rewrite applies InsteadOf to repo, the longest matching prefix first.
func (c *Cache) Rewrite(repo string) string {
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

// lock takes the clone's lock and returns its release; it gives up when
// ctx ends, with an error saying a fetch of the clone is under way.
func (c *Cache) lock(ctx context.Context, clone string) (func(), error) {
	c.mu.Lock()
	if c.locks == nil {
		c.locks = map[string]chan struct{}{}
	}
	m, ok := c.locks[clone]
	if !ok {
		m = make(chan struct{}, 1)
		c.locks[clone] = m
	}
	c.mu.Unlock()
	select {
	case m <- struct{}{}:
		return func() { <-m }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for another fetch of the clone to end: %w", context.Cause(ctx))
	}
}

func (c *Cache) originOf(clone string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.origin[clone]
}

func (c *Cache) setOrigin(clone, url string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.origin == nil {
		c.origin = map[string]string{}
	}
	c.origin[clone] = url
}

// Error is a failed git command with what it said.
type Error struct {
	Args   []string
	Err    error
	Stderr string
}

func (e *Error) Error() string {
	return fmt.Sprintf("git %s: %s", strings.Join(e.Args, " "), e.Why())
}

// Why is git's own last word on the failure (its standard error's last
// line), else how the command ended.
func (e *Error) Why() string {
	if msg := lastLine(e.Stderr); msg != "" {
		return msg
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// command is git against the repository at gitDir ("" for none), never
// prompting for credentials, and giving up on an http(s) server that sends
// nothing for StallTime (unless the environment says otherwise).
func command(ctx context.Context, gitDir string, args ...string) *exec.Cmd {
	full := args
	if gitDir != "" {
		full = append([]string{"--git-dir=" + gitDir}, args...)
	}
	cmd := exec.CommandContext(ctx, "git", full...)
	// A fetch runs git-remote-http(s) (or ssh) under git, holding git's
	// output: the context's end kills them all (their own process group),
	// and the output is given up on WaitDelay later. Else a fetch whose
	// context ended still waited for as long as its server stood still.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	if os.Getenv("GIT_HTTP_LOW_SPEED_LIMIT") == "" {
		cmd.Env = append(cmd.Env, "GIT_HTTP_LOW_SPEED_LIMIT=1")
	}
	if os.Getenv("GIT_HTTP_LOW_SPEED_TIME") == "" {
		cmd.Env = append(cmd.Env, fmt.Sprintf("GIT_HTTP_LOW_SPEED_TIME=%d", int(StallTime.Seconds())))
	}
	return cmd
}

// StallTime is how long a fetch over http(s) waits on a server that sends
// nothing at all (git's http.lowSpeedLimit of 1 byte a second over
// http.lowSpeedTime; GIT_HTTP_LOW_SPEED_LIMIT and _TIME override them)
// before it fails: a server that stands still (stopped with SIGSTOP, a
// dead proxy) would hold the fetch, and the build or plan waiting on it,
// for as long as it does. A server working on a big pack sends keepalives
// (git's uploadpack.keepAlive, every 5 s), so it is not taken for one.
const StallTime = time.Minute

// Git runs git against the repository at gitDir ("" for none) and returns
// its trimmed output; a failure is an *Error.
func Git(ctx context.Context, gitDir string, args ...string) (string, error) {
	cmd := command(ctx, gitDir, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", &Error{Args: args, Err: err, Stderr: stderr.String()}
	}
	return strings.TrimSpace(stdout.String()), nil
}

// Has reports whether repo's clone holds commit already, a full hash (a
// ref name may have moved: it is never held). It fetches nothing.
func (c *Cache) Has(ctx context.Context, repo, commit string) bool {
	if !ValidRepo(repo) || !FullHash(commit) {
		return false
	}
	clone, err := c.Clone(repo)
	if err != nil {
		return false
	}
	if _, err := os.Stat(filepath.Join(clone, "HEAD")); err != nil {
		return false
	}
	_, err = revParse(ctx, clone, commit)
	return err == nil
}
