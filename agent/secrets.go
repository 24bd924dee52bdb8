package agent

import (
	"cmp"
	"fmt"
	"path"
	"strconv"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
)

// secretNotes are the notes for a build's log of the RUN steps that mount
// what only a client supplies: a build secret or an SSH agent. The farm
// supplies neither (an agent's build has no client), so such a mount is
// empty — the step sees no file, or no agent, and fails only if the
// mount is required. Said once per mount, with its line,
// so that a step failing on a missing file says why. None for a
// Dockerfile that does not parse (the build says why).
func secretNotes(data []byte, req BuildRequest) []string {
	df, ok := parseDockerfile(data)
	if !ok {
		return nil
	}
	var notes []string
	for _, st := range df.stages {
		for _, c := range st.Commands {
			run, ok := c.(*instructions.RunCommand)
			// Parsed, a RUN's mounts wait for its words to be expanded:
			// with the Dockerfile's ARG defaults here.
			if !ok || run.Expand(func(w string) (string, error) { return df.expand(w), nil }) != nil {
				continue
			}
			line := ""
			if at := run.Location(); len(at) > 0 {
				line = ":" + strconv.Itoa(at[0].Start.Line)
			}
			for _, m := range instructions.GetMounts(run) {
				switch m.Type {
				case instructions.MountTypeSecret:
					id := cmp.Or(m.CacheID, path.Base(m.Target))
					target := cmp.Or(m.Target, "/run/secrets/"+id)
					what := "the step sees no " + target
					if m.Env != nil && *m.Env != "" {
						what = "the step sees no $" + *m.Env
					}
					if m.Required {
						what = "the step fails (required=true)"
					}
					notes = append(notes, fmt.Sprintf("secret: %s%s: RUN --mount=type=secret,id=%s: a build on the farm has no client to supply build secrets: %s", dockerfileName(req), line, id, what))
				case instructions.MountTypeSSH:
					what := "the step gets no SSH agent"
					if m.Required {
						what = "the step fails (required=true)"
					}
					notes = append(notes, fmt.Sprintf("ssh: %s%s: RUN --mount=type=ssh: a build on the farm has no client to forward an SSH agent: %s", dockerfileName(req), line, what))
				}
			}
		}
	}
	return notes
}
