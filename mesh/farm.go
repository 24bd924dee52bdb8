package mesh

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
)

// The farm's own modules: the build agent, the build controller and the git
// bridge. A catalogue of image modules works as it is: whichever of these
// roles no module of the catalogue fills is added from the copies the farm
// carries (farm/*.yaml), and Load says so with a warning. A catalogue that
// declares its own (to change a seat's retention, say) keeps it.
//
//go:embed farm/*.yaml
var farmFS embed.FS

// farmRole is one of the farm's own modules and how a catalogue module is
// recognised as filling its role.
type farmRole struct {
	module string
	role   string
	fills  func(*Manifest) bool
}

var farmRoles = []farmRole{
	{"build-agent", "declares the seat " + BuildSeat, func(m *Manifest) bool {
		return slices.ContainsFunc(m.Seats, func(s Seat) bool { return s.Seat == BuildSeat })
	}},
	{"build-controller", "holds " + ControllerSeat, func(m *Manifest) bool { return slices.Contains(m.Holds, ControllerSeat) }},
	{"git", "holds " + GitSeat, func(m *Manifest) bool { return slices.Contains(m.Holds, GitSeat) }},
}

// FarmManifests are the farm's own manifests, by file name
// ("build-agent.yaml"), as `builds catalogue init` writes them.
func FarmManifests() map[string][]byte {
	out := map[string][]byte{}
	for _, r := range farmRoles {
		data, err := fs.ReadFile(farmFS, path.Join("farm", r.module+".yaml"))
		if err != nil {
			panic(fmt.Sprintf("the farm's manifest %s is not embedded: %v", r.module, err))
		}
		out[r.module+".yaml"] = data
	}
	return out
}

// addFarm adds the farm's own module of every role no manifest fills and
// whose name no manifest takes, each with a warning naming it.
func addFarm(manifests []*Manifest, pos map[*Manifest]positions, broken map[string]string) ([]*Manifest, []Problem) {
	var problems []Problem
	files := FarmManifests()
	for _, r := range farmRoles {
		if slices.ContainsFunc(manifests, r.fills) || slices.ContainsFunc(manifests, func(m *Manifest) bool { return m.Module == r.module }) {
			continue
		}
		if _, ok := broken[r.module]; ok {
			continue
		}
		name := "(farm)/" + r.module + ".yaml"
		p := parse(name, files[r.module+".yaml"])
		if p.m == nil {
			panic(fmt.Sprintf("the farm's manifest %s does not parse: %v", r.module, p.probs))
		}
		p.m.File = name
		manifests = append(manifests, p.m)
		pos[p.m] = p.pos
		problems = append(problems, Problem{File: name, Warning: true,
			Message: fmt.Sprintf("added the farm's own module %s (no module %s): to change it, write it into the catalogue with `builds catalogue init DIR`", r.module, r.role)})
	}
	return manifests, problems
}
