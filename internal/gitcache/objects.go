package gitcache

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Object is what a clone says of an object name: its id and its type
// ("tree", "blob", "commit", "tag"), or type "missing".
type Object struct {
	ID   string
	Type string
}

// Objects asks the clone about each name (a revision such as
// "<commit>:<path>") in one git process.
func Objects(ctx context.Context, clone string, names ...string) ([]Object, error) {
	if len(names) == 0 {
		return nil, nil
	}
	cmd := command(ctx, clone, "cat-file", "--batch-check=%(objectname) %(objecttype)")
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, &Error{Args: []string{"cat-file", "--batch-check"}, Err: err, Stderr: stderr.String()}
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(names) {
		return nil, fmt.Errorf("git cat-file answered %d lines for %d names", len(lines), len(names))
	}
	objs := make([]Object, len(lines))
	for i, l := range lines {
		objs[i].Type = "missing"
		// A missing name is echoed back before "missing", spaces and all.
		if f := strings.Fields(l); len(f) == 2 && f[1] != "missing" {
			objs[i] = Object{ID: f[0], Type: f[1]}
		}
	}
	return objs, nil
}

// Archive writes the tree treeish of the clone into dir (which exists), from
// `git archive` in one git process: regular files with their executable
// bit, directories and symbolic links, as git stores them. The clone has no
// index or work tree to touch. empty are the directories it wrote with
// nothing in them, relative to dir: git stores no empty directory, but
// writes a submodule's (a gitlink) empty (Gitlinks tells them apart).
func Archive(ctx context.Context, clone, treeish, dir string) (empty []string, err error) {
	cmd := command(ctx, clone, "archive", "--format=tar", treeish)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	empty, rerr := untar(out, dir)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return nil, &Error{Args: []string{"archive", treeish}, Err: err, Stderr: stderr.String()}
	}
	return empty, rerr
}

// untar writes the archive r into dir and returns the directories it wrote
// with no entry under them.
func untar(r io.Reader, dir string) ([]string, error) {
	tr := tar.NewReader(r)
	var dirs []string
	full := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		name := path.Clean(h.Name)
		if name == "." || path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			continue
		}
		if h.Typeflag == tar.TypeDir {
			dirs = append(dirs, name)
		}
		full[path.Dir(name)] = true
		if err := writeEntry(tr, h, filepath.Join(dir, filepath.FromSlash(name))); err != nil {
			return nil, err
		}
	}
	var empty []string
	for _, d := range dirs {
		if !full[d] {
			empty = append(empty, d)
		}
	}
	return empty, nil
}

// writeEntry writes one entry of the archive at target.
func writeEntry(tr *tar.Reader, h *tar.Header, target string) error {
	switch h.Typeflag {
	case tar.TypeDir:
		return os.MkdirAll(target, 0o755)
	case tar.TypeSymlink:
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return os.Symlink(h.Linkname, target)
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
		return err
	}
	return nil
}
