package cascade

import (
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// indexAnnotations are the annotations of the index the tag of a module
// built for several platforms names: the repository and the revision it
// was built from. The revision changes with every commit, so it stays out
// of the identity index (and of every image manifest).
func indexAnnotations(m ModuleStatus) map[string]string {
	a := map[string]string{}
	if m.Source.Repo != "" {
		a[ocispec.AnnotationSource] = m.Source.Repo
	}
	if m.Commit != "" {
		a[ocispec.AnnotationRevision] = m.Commit
	} else if m.Source.Commit != "" {
		a[ocispec.AnnotationRevision] = m.Source.Commit
	}
	return a
}
