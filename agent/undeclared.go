package agent

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/distribution/reference"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// undeclaredBase refuses, as a source error, a Dockerfile that builds on a
// module of the catalogue (isModule) the ask does not supply as a base: a
// FROM, COPY --from or RUN --mount=from naming it by module name, or by its repository in
// the ask's registry, bare or tagged latest, that is no stage of the
// Dockerfile. The farm supplies, pinned to its digest, only the bases the
// module's build.on lists; any other name BuildKit resolves itself — a
// module's name on Docker Hub — and its failure would be retried as the
// registry's for the whole --retry-for, when the fix is the manifest's.
// A name an ARG makes without a default, a digest or another tag, or a
// Dockerfile that does not parse (the build says why), is left alone.
func undeclaredBase(data []byte, req BuildRequest, isModule func(string) bool) error {
	if isModule == nil {
		return nil
	}
	df, ok := parseDockerfile(data)
	if !ok {
		return nil
	}
	var registry string
	if named, err := reference.ParseNormalizedNamed(req.Image); err == nil {
		registry = reference.Domain(named)
	}
	check := func(i int, what, name string, at []parser.Range) error {
		name = df.expand(name)
		what += name
		if name == "" || strings.Contains(name, "$") || strings.EqualFold(name, "scratch") {
			return nil
		}
		if j, ok := df.byName[strings.ToLower(name)]; ok && j < i {
			return nil // an earlier stage
		}
		if named, err := reference.ParseNormalizedNamed(name); err == nil {
			if _, pinned := named.(reference.Digested); pinned {
				return nil // pinned by the Dockerfile itself
			}
		}
		look := lookupName(name)
		if _, ok := baseNamed(req.Bases, look); ok {
			return nil
		}
		module, ok := moduleNamed(look, registry)
		if !ok || !isModule(module) {
			return nil
		}
		var declared []string
		for _, b := range req.Bases {
			declared = append(declared, b.Module)
		}
		on := "none"
		if len(declared) > 0 {
			on = strings.Join(declared, ", ")
		}
		line := ""
		if len(at) > 0 {
			line = ":" + strconv.Itoa(at[0].Start.Line)
		}
		return classified(ErrSource, fmt.Sprintf("%s%s: %s names module %s of the catalogue, which is not among this module's bases (its build.on: %s): add %s to the build.on of %s, so that the farm builds it first and supplies it pinned to its digest",
			dockerfileName(req), line, what, module, on, module, req.Module), nil)
	}
	for i, st := range df.stages {
		if err := check(i, "FROM ", st.BaseName, st.Location); err != nil {
			return err
		}
		for _, c := range st.Commands {
			switch c := c.(type) {
			case *instructions.CopyCommand:
				if err := checkFrom(i, "COPY --from=", c.From, c.Location(), check); err != nil {
					return err
				}
			case *instructions.RunCommand:
				// RUN --mount=type=bind|cache,from=NAME reads an image as
				// COPY --from does.
				for _, m := range instructions.GetMounts(c) {
					if err := checkFrom(i, "RUN --mount=from=", m.From, c.Location(), check); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// checkFrom checks a --from name of stage i (none, or a stage by its
// index, is left alone).
func checkFrom(i int, what, from string, at []parser.Range, check func(int, string, string, []parser.Range) error) error {
	if from == "" {
		return nil
	}
	if _, err := strconv.Atoi(from); err == nil {
		return nil // a stage by its index
	}
	return check(i, what, from, at)
}

// moduleNamed is the module a FROM name (a lookupName) would be: the name
// itself when it is one word, or the repository's when it names one of
// the registry's top-level repositories.
func moduleNamed(name, registry string) (string, bool) {
	if strings.ContainsAny(name, ":@") && !strings.Contains(name, "/") {
		return "", false // a tag other than latest, or a digest: an image
	}
	if !strings.Contains(name, "/") {
		return name, name != ""
	}
	host, path, _ := strings.Cut(name, "/")
	if registry == "" || host != registry || strings.ContainsAny(path, "/:@") {
		return "", false
	}
	return path, true
}

// dockerfileName is req's Dockerfile, relative to its build context:
// "Dockerfile" unless the ask names another.
func dockerfileName(req BuildRequest) string {
	if req.Source.Dockerfile != "" {
		return req.Source.Dockerfile
	}
	return "Dockerfile"
}

// shadowedBase refuses, as a source error, a Dockerfile with a stage named
// like a base the ask supplies (contextNames: its module's name, its
// repository's): BuildKit builds a stage whose name is a named context as
// that context — the stage's own FROM and instructions are dropped
// without a word (dockerfile2llb's toDispatchState), where docker build,
// without the context, runs them. So a stage of that name would be built
// as the pinned base, silently. A stage that only names its base (FROM
// runtime AS runtime, no instructions) is that base either way and is left
// alone; so is a Dockerfile that does not parse (the build says why).
func shadowedBase(data []byte, req BuildRequest) error {
	df, ok := parseDockerfile(data)
	if !ok {
		return nil
	}
	for _, st := range df.stages {
		if st.Name == "" {
			continue
		}
		name := strings.ToLower(st.Name)
		b, ok := baseNamed(req.Bases, name)
		if !ok {
			continue
		}
		from := df.expand(st.BaseName)
		if same, ok := baseNamed(req.Bases, lookupName(from)); ok && same.Module == b.Module && len(st.Commands) == 0 {
			continue
		}
		line := ""
		if len(st.Location) > 0 {
			line = ":" + strconv.Itoa(st.Location[0].Start.Line)
		}
		dropped := "FROM " + from
		if n := len(st.Commands); n > 0 {
			dropped += fmt.Sprintf(" and its %d instruction(s)", n)
		}
		return classified(ErrSource, fmt.Sprintf("%s%s: stage %s has the name of base %s, which the farm supplies under that name pinned to its digest; BuildKit builds a stage of that name as the base itself, so its %s would not be built: rename the stage (FROM %s AS %s-stage) and what refers to it",
			dockerfileName(req), line, name, b.Module, dropped, from, name), nil)
	}
	return nil
}
