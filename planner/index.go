package planner

import (
	"path"
	"slices"
	"strings"

	"github.com/meshbuild/meshbuild/mesh"
)

// Index is a catalogue's build graph, indexed once so that any number of
// plans are made in time linear in their size. It is immutable and safe for
// concurrent use. Make a new one when the catalogue changes.
type Index struct {
	names  []string         // built modules, sorted
	pos    map[string]int32 // name -> index in names
	known  map[string]bool  // every module of the catalogue, built or not
	man    []*mesh.Manifest // by index
	repo   []string         // NormaliseRepo(build.repo), by index
	dir    []string         // cleaned build.path ("." for the whole repo)
	file   []string         // cleaned path of the Dockerfile in the repo
	on     [][]string       // build.on, deduplicated, declared order
	bases  [][]int32        // build.on that are built modules, sorted
	deps   [][]int32        // built modules built on this one, sorted
	byRepo map[string][]int32
}

// NewIndex indexes the built modules of a catalogue.
func NewIndex(c *mesh.Catalogue) *Index {
	built := c.Built()
	n := len(built)
	ix := &Index{
		names:  make([]string, n),
		pos:    make(map[string]int32, n),
		known:  make(map[string]bool, len(c.Modules)),
		man:    built,
		repo:   make([]string, n),
		dir:    make([]string, n),
		file:   make([]string, n),
		on:     make([][]string, n),
		bases:  make([][]int32, n),
		deps:   make([][]int32, n),
		byRepo: map[string][]int32{},
	}
	for _, m := range c.Modules {
		ix.known[m.Module] = true
	}
	for i, m := range built { // sorted by name: index order is name order
		ix.names[i] = m.Module
		ix.pos[m.Module] = int32(i)
	}
	for i, m := range built {
		b := m.Build
		ix.repo[i] = NormaliseRepo(b.Repo)
		ix.byRepo[ix.repo[i]] = append(ix.byRepo[ix.repo[i]], int32(i))
		ix.dir[i] = cleanRel(b.Path)
		ix.file[i] = path.Join(ix.dir[i], b.DockerfileOrDefault())
		ix.on[i] = make([]string, 0, len(b.On))
		for _, base := range b.On {
			if slices.Contains(ix.on[i], base) {
				continue
			}
			ix.on[i] = append(ix.on[i], base)
			if j, ok := ix.pos[base]; ok {
				ix.bases[i] = append(ix.bases[i], j)
				ix.deps[j] = append(ix.deps[j], int32(i))
			}
		}
		slices.Sort(ix.bases[i])
	}
	// deps[j] were appended in increasing i: already sorted.
	return ix
}

// Len is the number of built modules indexed.
func (ix *Index) Len() int { return len(ix.names) }

// Dependents returns, for every module of the index that others are built
// on, the built modules whose build.on names it (directly), sorted.
func (ix *Index) Dependents() map[string][]string {
	out := make(map[string][]string)
	for j, ds := range ix.deps {
		if len(ds) == 0 {
			continue
		}
		names := make([]string, len(ds))
		for k, d := range ds {
			names[k] = ix.names[d]
		}
		out[ix.names[j]] = names
	}
	return out
}

// Dependents returns, for every built module of c that others are built on,
// the modules whose build.on names it, sorted. Bases that are not built
// modules of the catalogue are left out.
func Dependents(c *mesh.Catalogue) map[string][]string {
	return NewIndex(c).Dependents()
}

// cleanRel cleans a repository-relative path: leading "/" and "./",
// trailing "/" and ".." above the root do not matter; "" is "." (the whole
// repository).
func cleanRel(p string) string {
	c := path.Clean("/" + strings.TrimSpace(p))
	if c == "/" {
		return "."
	}
	return c[1:]
}
