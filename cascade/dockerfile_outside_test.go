package cascade_test

import (
	"testing"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cascade/cascadetest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/registry"
)

// TestADockerfileBesideTheContextIsBuiltAndKeyed: a module whose
// build.dockerfile climbs out of its build.path (`dockerfile:
// ../docker/app.Dockerfile`, as `docker build -f docker/app.Dockerfile
// app` reads it) is built by a real agent, its Dockerfile's directory
// mounted as the Dockerfile; its input key names that directory's tree, so
// a change to the Dockerfile alone rebuilds it (not taken for unchanged,
// `builds why` naming the Dockerfile's directory), a rebuild with nothing
// changed reuses it, and a change to a file it copies rebuilds it too. The
// Dockerfile's own .dockerignore, beside it, is the one the build reads: a
// file of the context it names changes nothing in the image.
func TestADockerfileBesideTheContextIsBuiltAndKeyed(t *testing.T) {
	bed := cascadetest.RealBed(t, map[string]string{
		"base/Dockerfile":                    "FROM busybox\nCOPY motd /etc/motd\n",
		"base/motd":                          "hello\n",
		"app/app.txt":                        "app\n",
		"app/notes.md":                       "not in the image\n",
		"docker/app.Dockerfile":              "FROM base\nCOPY . /app/\n",
		"docker/app.Dockerfile.dockerignore": "*.md\n",
	}, map[string][]string{"busybox": nil, "base": {"busybox"}, "app": {"base"}})
	app, _ := bed.Cat.Module("app")
	app.Build.Dockerfile = "../docker/app.Dockerfile"
	if ps := mesh.Check(bed.Cat.Modules); mesh.HasErrors(ps) {
		t.Fatalf("the catalogue with app's Dockerfile beside its context: %v", ps)
	}

	cfg := cascade.DefaultConfig()
	cfg.Registry, cfg.RegistryClient = bed.Reg, registry.NewClient(registry.WithInsecure(true))
	cfg.Sources, cfg.InsteadOf = t.TempDir(), map[string]string{meshtest.FleetRepo: bed.Git}
	c := bed.Controller(t, cfg)
	bed.Agent(t, testenv.Buildkitd(t, bed.Reg), "m1")

	d := newPlanDriver(t, bed, c.Module())
	first := d.rebuild("first", false)
	if first["app"].State != cascade.Built || first["app"].DockerfileTree == "" || first["app"].Key == "" {
		t.Fatalf("app's first build: %s, Dockerfile's directory tree %q, key %q: want built, keyed with the tree", first["app"].State, first["app"].DockerfileTree, first["app"].Key)
	}
	if again := d.rebuild("again", false); again["app"].State != cascade.Unchanged || again["app"].Digest != first["app"].Digest {
		t.Fatalf("nothing changed: app %s at %s, want unchanged at %s", again["app"].State, again["app"].Digest, first["app"].Digest)
	}

	// The Dockerfile alone changes: app is built again, to a new image.
	_, df := d.push(map[string]string{"docker/app.Dockerfile": "FROM base\nCOPY . /app/\nRUN echo two > /two\n"})
	if df["app"].State != cascade.Built || df["app"].Digest == first["app"].Digest || df["app"].DockerfileTree == first["app"].DockerfileTree {
		t.Fatalf("after a change to app's Dockerfile: %s at %s (first %s), directory tree %s (first %s): want built anew",
			df["app"].State, df["app"].Digest, first["app"].Digest, df["app"].DockerfileTree, first["app"].DockerfileTree)
	}
	w := cascade.WhyOf("", false, df["app"])
	if len(w.Changes) != 1 || w.Changes[0].Input != "dockerfile directory" {
		t.Errorf("why app was built after its Dockerfile changed: %+v, want the Dockerfile's directory alone", w.Changes)
	}

	// A file its .dockerignore leaves out changes: built (its context
	// changed), to the image it had.
	_, ignored := d.push(map[string]string{"app/notes.md": "still not in the image\n"})
	if ignored["app"].State != cascade.Built || ignored["app"].Digest != df["app"].Digest {
		t.Errorf("after a change to a file app.Dockerfile.dockerignore leaves out: %s at %s, want built to the digest it had, %s", ignored["app"].State, ignored["app"].Digest, df["app"].Digest)
	}

	// A file of its context changes: built again too.
	_, ctx := d.push(map[string]string{"app/app.txt": "app, two\n"})
	if ctx["app"].State != cascade.Built || ctx["app"].Digest == df["app"].Digest {
		t.Fatalf("after a change to app.txt: %s at %s, want built anew (was %s)", ctx["app"].State, ctx["app"].Digest, df["app"].Digest)
	}
}
