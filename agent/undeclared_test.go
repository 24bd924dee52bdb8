package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/mesh"
)

// A Dockerfile that builds on a module of the catalogue its ask does not
// supply is a source error naming the line, the module and the fix; what
// the ask supplies, stages, images outside the catalogue, other tags and
// digests, and names an ARG without a default makes are left to the build.
func TestADockerfileOnAModuleNotInBuildOnIsASourceError(t *testing.T) {
	modules := map[string]bool{"base": true, "runtime": true, "lib": true, "app": true}
	isModule := func(m string) bool { return modules[m] }
	req := BuildRequest{Ask: mesh.Ask{Module: "app", Image: "127.0.0.1:5000/app",
		Bases: []mesh.Base{{Module: "base", Image: "127.0.0.1:5000/base", Digest: "sha256:" + strings.Repeat("a", 64)}}}}
	for _, c := range []struct {
		dockerfile, want string // want: "" for no error
	}{
		{"FROM base\nRUN true\n", ""},
		{"FROM 127.0.0.1:5000/base:latest\n", ""},
		{"FROM runtime\n", "Dockerfile:1: FROM runtime names module runtime of the catalogue, which is not among this module's bases (its build.on: base): add runtime to the build.on of app"},
		{"FROM base\nRUN true\nFROM 127.0.0.1:5000/runtime\n", "Dockerfile:3: FROM 127.0.0.1:5000/runtime names module runtime"},
		{"FROM 127.0.0.1:5000/runtime:latest\n", "FROM 127.0.0.1:5000/runtime:latest names module runtime"},
		{"ARG B=lib\nFROM ${B}\n", "Dockerfile:2: FROM lib names module lib"},
		{"FROM base AS build\nRUN true\nFROM base\nCOPY --from=lib /x /x\n", "Dockerfile:4: COPY --from=lib names module lib"},
		{"FROM base\nRUN --mount=type=bind,from=lib,target=/l cat /l/x\n", "Dockerfile:2: RUN --mount=from=lib names module lib"},
		{"FROM base\nRUN --mount=type=cache,target=/c --mount=from=runtime,target=/r true\n", "RUN --mount=from=runtime names module runtime"},
		{"FROM base AS b\nFROM base\nRUN --mount=from=b,target=/b --mount=from=0,target=/z --mount=from=base,target=/x --mount=type=cache,target=/c true\n", ""},
		{"FROM base AS runtime\nFROM runtime\nCOPY --from=runtime /x /x\n", ""}, // a stage named like a module
		{"FROM base AS build\nFROM base\nCOPY --from=0 /x /x\nCOPY --from=build /y /y\n", ""},
		{"FROM alpine\n", ""},                    // not a module
		{"FROM runtime:1.2\n", ""},               // another tag: an image
		{"FROM 127.0.0.1:5000/runtime:v1\n", ""}, // likewise
		{"FROM runtime@sha256:" + strings.Repeat("b", 64) + "\n", ""},
		{"FROM other.example/runtime\n", ""}, // another registry
		{"FROM 127.0.0.1:5000/team/runtime\n", ""},
		{"ARG B\nFROM ${B}\n", ""}, // no default: the build says
		{"FROM scratch\n", ""},
		{"FROM\n", ""}, // does not parse: the build says why
	} {
		err := undeclaredBase([]byte(c.dockerfile), req, isModule)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v, want no error", c.dockerfile, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrSource) || Classify(err) != mesh.ReasonSource):
			t.Errorf("%q: %v, want a source error containing %q", c.dockerfile, err, c.want)
		}
	}
	if err := undeclaredBase([]byte("FROM runtime\n"), req, nil); err != nil {
		t.Errorf("without a catalogue: %v, want none (nothing to tell a module from an image)", err)
	}
	req.Source.Dockerfile = "docker/Dockerfile.prod"
	if err := undeclaredBase([]byte("FROM runtime\n"), req, isModule); err == nil || !strings.HasPrefix(err.Error(), "source: docker/Dockerfile.prod:1: ") && !strings.Contains(err.Error(), "docker/Dockerfile.prod:1: FROM runtime") {
		t.Errorf("a Dockerfile elsewhere: %v, want it named", err)
	}
}

// A stage named like a base the ask supplies would be built as that base
// (BuildKit replaces a stage named like a named context), its own FROM and
// instructions dropped: a source error naming the line, the stage and the
// fix. A stage that only names its base, stages named like modules the ask
// does not supply, and unnamed stages are left to the build.
func TestAStageNamedLikeASuppliedBaseIsASourceError(t *testing.T) {
	req := BuildRequest{Ask: mesh.Ask{Module: "app", Image: "127.0.0.1:5000/app",
		Bases: []mesh.Base{
			{Module: "runtime", Image: "127.0.0.1:5000/runtime", Digest: "sha256:" + strings.Repeat("a", 64)},
			{Module: "lib", Image: "127.0.0.1:5000/team-lib", Digest: "sha256:" + strings.Repeat("b", 64)},
		}}}
	for _, c := range []struct {
		dockerfile, want string // want: "" for no error
	}{
		{"FROM runtime AS runtime\nRUN echo s > /s\nFROM runtime\nCOPY --from=runtime /s /s\n",
			"Dockerfile:1: stage runtime has the name of base runtime, which the farm supplies under that name pinned to its digest; BuildKit builds a stage of that name as the base itself, so its FROM runtime and its 1 instruction(s) would not be built: rename the stage (FROM runtime AS runtime-stage)"},
		{"FROM runtime\nRUN true\nFROM alpine AS Runtime\n", "Dockerfile:3: stage runtime has the name of base runtime"},
		{"FROM busybox AS runtime\nFROM runtime\n", "stage runtime has the name of base runtime, which the farm supplies under that name pinned to its digest; BuildKit builds a stage of that name as the base itself, so its FROM busybox would not be built"},
		{"FROM runtime AS team-lib\nRUN true\n", ""}, // lib's repository is supplied as 127.0.0.1:5000/team-lib, no stage's name
		{"FROM runtime AS lib\nRUN true\n", "stage lib has the name of base lib"},
		{"FROM runtime AS runtime\nFROM runtime\nRUN true\n", ""},             // only names its base
		{"FROM 127.0.0.1:5000/runtime:latest AS runtime\nFROM runtime\n", ""}, // likewise
		{"FROM runtime AS base\nRUN true\nFROM base\n", ""},                   // a module the ask does not supply
		{"FROM runtime AS build\nRUN true\nFROM runtime\nCOPY --from=build /x /x\n", ""},
		{"FROM\n", ""}, // does not parse: the build says why
	} {
		err := shadowedBase([]byte(c.dockerfile), req)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v, want no error", c.dockerfile, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrSource) || Classify(err) != mesh.ReasonSource):
			t.Errorf("%q: %v, want a source error containing %q", c.dockerfile, err, c.want)
		}
	}
}
