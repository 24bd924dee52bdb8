package mesh_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// The claims bucket is raised with the rest of the wire, per-key TTLs on, and
// is no module's: a module's bucket name can never derive it.
func TestTheClaimsBucketIsRaisedWithTheWire(t *testing.T) {
	c := mesh.NewCatalogue(fixture())
	w := c.Derive(1)
	var found bool
	for _, b := range w.Buckets {
		if b.Config.Bucket == mesh.ClaimsBucket() {
			found = true
			if b.Config.LimitMarkerTTL <= 0 || b.Config.History != 1 {
				t.Fatalf("claims bucket %+v: want per-key TTLs (LimitMarkerTTL) and one revision", b.Config)
			}
		}
		if b.Module != "" && strings.ToLower(b.Config.Bucket) == strings.ToLower(mesh.ClaimsBucket()) {
			t.Fatalf("module %s derives the claims bucket's name", b.Module)
		}
	}
	if !found {
		t.Fatal("the wire has no claims bucket")
	}
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	if err := mesh.RaiseClaims(ctx(t), js, 1); err != nil {
		t.Fatal(err)
	}
	r, err := mesh.Raise(ctx(t), js, c, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.Unchanged, "bucket "+mesh.ClaimsBucket()) || slices.Contains(r.Orphans, "bucket "+mesh.ClaimsBucket()) {
		t.Fatalf("raising after RaiseClaims: %+v", r)
	}
	if mesh.ClaimKey("mesh-controller", "") != "mesh-controller.mesh" || mesh.ClaimKey("node-build-agent", "m1") != "node-build-agent.node.m1" {
		t.Fatal("claim keys changed: holders of an older version would not see each other")
	}
}

// Every principal that holds a seat may write that seat's claims and read
// the bucket; it may write no other seat's claim, and a principal holding
// no seat has no grant on the bucket at all.
func TestHoldersAreGrantedTheirSeatsClaims(t *testing.T) {
	c := mesh.NewCatalogue(fixture())
	claims := func(p mesh.Permissions) []string {
		var out []string
		for _, s := range p.Publish {
			if strings.Contains(s, mesh.ClaimsBucket()) {
				out = append(out, s)
			}
		}
		return out
	}
	writes := func(p mesh.Permissions) []string {
		var out []string
		for _, s := range claims(p) {
			if strings.HasPrefix(s, "$KV.") {
				out = append(out, s)
			}
		}
		return out
	}
	for module, seats := range map[string][]string{
		"build-agent":      {mesh.BuildSeat},
		"build-controller": {mesh.ControllerSeat},
		"git":              {mesh.GitSeat},
		"shop":             nil,
	} {
		m, _ := c.Module(module)
		p := c.ModulePermissions(m)
		var want []string
		for _, s := range seats {
			want = append(want, mesh.ClaimSubjects(s))
		}
		if module == mesh.AgentModule {
			// A machine claims its own seat only.
			p, _ = c.MachinePermissions("m1")
			want = []string{mesh.KVKeySubject(mesh.ClaimsBucket(), mesh.ClaimKey(mesh.BuildSeat, "m1"))}
		}
		if got := writes(p); !slices.Equal(got, want) {
			t.Errorf("%s writes claims %v, want %v", module, got, want)
		}
		if len(seats) == 0 && len(claims(p)) > 0 {
			t.Errorf("%s holds no seat but is granted %v", module, claims(p))
		}
		if len(seats) > 0 && !slices.Contains(p.Publish, "$JS.API.STREAM.INFO."+mesh.KVStream(mesh.ClaimsBucket())) {
			t.Errorf("%s cannot open the claims bucket", module)
		}
	}
	if got := writes(c.ControllerPermissions("controller")); !slices.Contains(got, mesh.ClaimSubjects(mesh.ControllerSeat)) {
		t.Errorf("the controller writes claims %v", got)
	}
}
