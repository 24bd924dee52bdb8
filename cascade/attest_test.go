package cascade

import (
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/mesh"
)

// The attestations a built event names are kept with the module (per
// platform for a module of several, whose index, assembled by the
// controller from the platforms' images, has none).
func TestBuiltKeepsItsAttestations(t *testing.T) {
	s := twoPlatforms(t)
	base := byModule(t, s.Start(at(0)), "base")
	att := func(c string) *mesh.Attestations {
		return &mesh.Attestations{Index: "sha256:" + strings.Repeat(c, 64), Manifest: "sha256:" + strings.Repeat("e", 64),
			Provenance: "sha256:" + strings.Repeat("f", 64)}
	}
	for i, p := range []string{"linux/amd64", "linux/arm64"} {
		ev := built(base, 1)
		ev.Ask, ev.Digest, ev.Attestations = platformEvent(base, p), "sha256:"+strings.Repeat("ab"[i:i+1], 64), att("cd"[i:i+1])
		s.Built(ev, at(1))
	}
	ms := stateOf(t, s, "base")
	if ms.Platforms[0].Attestations.Index != att("c").Index || ms.Platforms[1].Attestations.Index != att("d").Index {
		t.Errorf("platforms %+v: want each platform's attestations", ms.Platforms)
	}
	u := s.Unindexed()
	if len(u) != 1 {
		t.Fatalf("unindexed %+v", u)
	}
	index := built(base, 2)
	index.Ask, index.Digest = base.AskID, "sha256:"+strings.Repeat("9", 64)
	app := byModule(t, s.Built(index, at(2)), "app")
	if ms := stateOf(t, s, "base"); ms.State != Built || ms.Attestations != nil {
		t.Errorf("base %s with attestations %+v: want built by its index, none", ms.State, ms.Attestations)
	}

	ev := built(app, 3)
	ev.Attestations = att("1")
	s.Built(ev, at(3))
	if ms := stateOf(t, s, "app"); ms.Attestations == nil || *ms.Attestations != *att("1") {
		t.Errorf("app attestations %+v, want %+v", ms.Attestations, att("1"))
	}
}
