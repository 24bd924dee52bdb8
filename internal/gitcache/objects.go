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

// Written is what Archive wrote that a build may find missing.
type Written struct {
	// Empty are the directories written with nothing in them, relative
	// to the directory written: git stores no empty directory, but
	// writes a submodule's (a gitlink) empty (Gitlinks tells them apart).
	Empty []string
	// LFS are the files written that are Git LFS pointers, relative to
	// the directory written: git stores the pointer, and the object it
	// names is not fetched (git-lfs is not run).
	LFS []string
}

// Archive writes the tree treeish of the clone into dir (which exists), from
// `git archive` in one git process: regular files with their executable
// bit, directories and symbolic links, as git stores them. The clone has no
// index or work tree to touch.
func Archive(ctx context.Context, clone, treeish, dir string) (Written, error) {
	cmd := command(ctx, clone, "archive", "--format=tar", treeish)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return Written{}, err
	}
	if err := cmd.Start(); err != nil {
		return Written{}, err
	}
	w, rerr := untar(out, dir)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return Written{}, &Error{Args: []string{"archive", treeish}, Err: err, Stderr: stderr.String()}
	}
	return w, rerr
}

// lfsPointerMax bounds a Git LFS pointer's size (the spec's pointers are
// about 130 bytes; git-lfs reads at most 1024).
const lfsPointerMax = 1024

// isLFSPointer reports whether a file's content is a Git LFS pointer: its
// first line names the spec (git-lfs's own test, the older hawser name
// too).
func isLFSPointer(b []byte) bool {
	return bytes.HasPrefix(b, []byte("version https://git-lfs.github.com/spec/v1\n")) ||
		bytes.HasPrefix(b, []byte("version https://hawser.github.com/spec/v1\n"))
}

// untar writes the archive r into dir and returns the directories it wrote
// with no entry under them and the Git LFS pointers.
func untar(r io.Reader, dir string) (Written, error) {
	tr := tar.NewReader(r)
	var dirs, lfs []string
	full := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Written{}, err
		}
		name := path.Clean(h.Name)
		if name == "." || path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			continue
		}
		if h.Typeflag == tar.TypeDir {
			dirs = append(dirs, name)
		}
		full[path.Dir(name)] = true
		var content io.Reader = tr
		if h.Typeflag == tar.TypeReg && h.Size <= lfsPointerMax {
			// A small file is read whole first: it may be a pointer.
			b, err := io.ReadAll(tr)
			if err != nil {
				return Written{}, err
			}
			if isLFSPointer(b) {
				lfs = append(lfs, name)
			}
			content = bytes.NewReader(b)
		}
		if err := writeEntry(content, h, filepath.Join(dir, filepath.FromSlash(name))); err != nil {
			return Written{}, err
		}
	}
	w := Written{LFS: lfs}
	for _, d := range dirs {
		if !full[d] {
			w.Empty = append(w.Empty, d)
		}
	}
	return w, nil
}

// writeEntry writes one entry of the archive at target.
func writeEntry(content io.Reader, h *tar.Header, target string) error {
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
		_, err = io.Copy(f, content)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return nil
}
