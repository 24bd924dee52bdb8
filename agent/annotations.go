package agent

import (
	"bytes"
	"os"
	"slices"
	"strings"

	"github.com/distribution/reference"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/meshbuild/meshbuild/mesh"
)

// # Annotations
//
// Every image manifest carries the OCI image spec's annotations for what
// the farm knows better than anyone: the base its final stage is built
// FROM, pinned by digest (org.opencontainers.image.base.digest and
// .base.name), and the repository it was built from
// (org.opencontainers.image.source). Each is an input of the build, so the
// image stays a function of its inputs: nothing that changes with an
// unrelated commit goes into it, or early cutoff would never cut. The
// revision goes where a new build may differ anyway: the provenance
// (vcs:revision) and the index the tag names
// (org.opencontainers.image.revision, with the others).
//
// They are given to BuildKit's image exporter as annotation-manifest.<key>
// and annotation-index.<key> attributes.

// manifestAnnotations are the annotations of req's image manifest;
// dockerfile is its Dockerfile, read for the final stage's base.
func manifestAnnotations(req BuildRequest, dockerfile []byte) map[string]string {
	a := map[string]string{}
	if req.Source.Repo != "" {
		a[ocispec.AnnotationSource] = req.Source.Repo
	}
	if base, ok := finalBase(dockerfile, req.Bases); ok {
		a[ocispec.AnnotationBaseImageName] = base.Image
		a[ocispec.AnnotationBaseImageDigest] = base.Digest
	}
	return a
}

// indexAnnotations are the annotations of the index pushed with
// attestations: the manifest's, and the revision built.
func indexAnnotations(req BuildRequest, manifest map[string]string) map[string]string {
	a := map[string]string{}
	for k, v := range manifest {
		a[k] = v
	}
	if req.Source.Commit != "" {
		a[ocispec.AnnotationRevision] = req.Source.Commit
	}
	return a
}

// finalBase is the base among bases that the Dockerfile's last stage is
// built FROM, following stages built FROM other stages; false when it is
// none of them (scratch, an image outside the mesh, a name an unset ARG
// makes) or the Dockerfile does not parse (the build says why).
func finalBase(dockerfile []byte, bases []mesh.Base) (mesh.Base, bool) {
	df, ok := parseDockerfile(dockerfile)
	if !ok {
		return mesh.Base{}, false
	}
	name := ""
	for i, seen := len(df.stages)-1, 0; seen <= len(df.stages); seen++ {
		name = df.expand(df.stages[i].BaseName)
		j, ok := df.byName[strings.ToLower(name)]
		if !ok || j >= i {
			break
		}
		i = j
	}
	return baseNamed(bases, lookupName(name))
}

// parsedDockerfile is a Dockerfile's stages as BuildKit parses them, the
// defaults of its ARGs before the first FROM, and its stages' names
// (lower case) with their index.
type parsedDockerfile struct {
	stages   []instructions.Stage
	defaults map[string]string
	byName   map[string]int
}

// parseDockerfile parses a Dockerfile; false when it does not parse, or
// has no stage (the build says why).
func parseDockerfile(data []byte) (parsedDockerfile, bool) {
	res, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		return parsedDockerfile{}, false
	}
	stages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil || len(stages) == 0 {
		return parsedDockerfile{}, false
	}
	df := parsedDockerfile{stages: stages, defaults: map[string]string{}, byName: map[string]int{}}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if kv.Value != nil {
				df.defaults[kv.Key] = *kv.Value
			}
		}
	}
	for i, s := range stages {
		if s.Name != "" {
			df.byName[strings.ToLower(s.Name)] = i
		}
	}
	return df, true
}

// expand is name with the Dockerfile's ARG defaults in it.
func (df parsedDockerfile) expand(name string) string {
	return os.Expand(name, func(k string) string { return df.defaults[k] })
}

// lookupName is a FROM name as the frontend looks it up among the named
// contexts: normalised, ":latest" dropped.
func lookupName(name string) string {
	if named, err := reference.ParseNormalizedNamed(name); err == nil {
		if t, ok := named.(reference.Tagged); !ok || t.Tag() == "latest" {
			return reference.FamiliarName(named)
		}
	}
	return name
}

// baseNamed is the base among bases supplied under name (a lookupName):
// a base stands for the names contextNames supplies it under.
func baseNamed(bases []mesh.Base, name string) (mesh.Base, bool) {
	for _, b := range bases {
		names, err := contextNames(b)
		if err != nil {
			continue
		}
		if slices.Contains(names, name) {
			return b, true
		}
	}
	return mesh.Base{}, false
}
