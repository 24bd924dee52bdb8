package cli_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// `builds creds init` and `issue` make what an operator points a server
// at and what each component connects with: a server configured from
// server.conf admits the controller under its issued credentials and
// `builds` under the operator's, found through MESHBUILD_STATE where
// `builds up` keeps them; without credentials `builds` is told what to
// set. Bad requests get a clear error.
func TestCredsInitIssue(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	code, out, errw := run(t, "creds", "init", keys)
	if code != 0 || !strings.Contains(out, filepath.Join(keys, creds.ServerConf)) {
		t.Fatalf("creds init: exit %d\n%s\n%s", code, out, errw)
	}
	// It says what a server of the fleet needs beside the include.
	if want := fmt.Sprintf("request_queue_limit: %d", mesh.FleetSettingsOf(mesh.DefaultFleet).APIQueueLimit); !strings.Contains(out, want) {
		t.Errorf("creds init does not advise %q:\n%s", want, out)
	}
	if code, _, errw := run(t, "creds", "init", keys); code != 1 || !strings.Contains(errw, "already exist") {
		t.Errorf("creds init twice: exit %d, %q", code, errw)
	}

	dir := t.TempDir()
	state := t.TempDir()
	issued := map[string][]string{
		filepath.Join(dir, "controller.creds"): {"--principal", "controller"},
		farm.OperatorCredsIn(state):            {"--principal", "operator"},
		filepath.Join(dir, "m1.creds"):         {"--principal", "node", "m1"},
		filepath.Join(dir, "agent.creds"):      {"--principal", "agent", "m1"},
		filepath.Join(dir, "git.creds"):        {"--principal", "module", "--name", "git"},
	}
	for file, args := range issued {
		args = append([]string{"creds", "issue", keys, "--catalogue", fleet(t), "--out", file}, args...)
		if code, out, errw := run(t, args...); code != 0 || !strings.Contains(out, "may publish") {
			t.Errorf("%v: exit %d\n%s\n%s", args, code, out, errw)
			continue
		}
		if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v; want mode 0600", file, fi, err)
		}
	}
	// A node's credentials carry the build agent's bucket (--carries
	// build-agent by default); --carries '' none, without a catalogue.
	if pub := credsPublish(t, filepath.Join(dir, "m1.creds")); !slices.Contains(pub, mesh.KVKeySubject(mesh.KVBucket(mesh.AgentModule, mesh.AgentBuildsBucket), mesh.BuildRecordKey("*", "m1"))) {
		t.Errorf("node m1 may not write the agent's records: %v", pub)
	}
	bare := filepath.Join(dir, "bare.creds")
	if code, out, errw := run(t, "creds", "issue", keys, "--principal", "node", "m2", "--carries", "", "--out", bare); code != 0 || !strings.Contains(out, "carrying no module") {
		t.Errorf("a node carrying nothing: exit %d\n%s\n%s", code, out, errw)
	} else if pub := credsPublish(t, bare); !slices.Equal(pub, mesh.NodePermissions("m2").Publish) {
		t.Errorf("a node carrying nothing may publish %v, want its own set %v", pub, mesh.NodePermissions("m2").Publish)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"creds", "issue", keys, "--principal", "node", "--out", "x.creds"}, "needs its name"},
		{[]string{"creds", "issue", keys, "--principal", "controller", "c1", "--catalogue", fleet(t), "--out", "x.creds"}, "takes no name"},
		{[]string{"creds", "issue", keys, "--principal", "wizard", "--catalogue", fleet(t), "--out", "x.creds"}, `unknown principal "wizard"`},
		{[]string{"creds", "issue", keys, "--principal", "module", "nosuch", "--catalogue", fleet(t), "--out", "x.creds"}, `no module "nosuch"`},
		{[]string{"creds", "issue", keys, "--principal", "operator", "--catalogue", ""}, "no --out"},
		{[]string{"creds", "issue", keys, "--principal", "operator", "--catalogue", "", "--out", "x.creds"}, "no catalogue"},
		{[]string{"creds", "issue", t.TempDir(), "--principal", "node", "m1", "--out", "x.creds"}, "builds creds init"},
		{[]string{"creds", "issue", keys, "--principal", "node", "M.1", "--out", "x.creds"}, "node name"},
		{[]string{"creds", "issue", keys, "--principal", "node", "m1", "--out", "x.creds"}, "carries build-agent"},
		{[]string{"creds", "issue", keys, "--principal", "node", "m1", "--carries", "nosuch", "--catalogue", fleet(t), "--out", "x.creds"}, `"nosuch"`},
		{[]string{"creds", "issue", keys, "--principal", "controller", "--carries", "git", "--catalogue", fleet(t), "--out", "x.creds"}, "--carries is for --principal node"},
		// Every build machine has its own; names that are another
		// principal's, or the mesh's own, are refused (issue 19).
		{[]string{"creds", "issue", keys, "--principal", "agent", "--catalogue", fleet(t), "--out", "x.creds"}, "needs the build machine's name"},
		{[]string{"creds", "issue", keys, "--principal", "node", "operator", "--catalogue", fleet(t), "--out", "x.creds"}, "is reserved"},
		{[]string{"creds", "issue", keys, "--principal", "node", "build-agent", "--catalogue", fleet(t), "--out", "x.creds"}, "is reserved"},
		{[]string{"creds", "issue", keys, "--principal", "agent", "controller", "--catalogue", fleet(t), "--out", "x.creds"}, "is reserved"},
		{[]string{"creds", "issue", keys, "--principal", "node", "mesh-git", "--catalogue", fleet(t), "--out", "x.creds"}, "is reserved"},
	} {
		if code, _, errw := run(t, bad.args...); code != 1 || !strings.Contains(errw, bad.want) {
			t.Errorf("%v: exit %d, %q; want %q", bad.args, code, errw, bad.want)
		}
	}

	k, err := creds.Open(keys)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := k.ServerOptions()
	if err != nil {
		t.Fatal(err)
	}
	s := natstest.Server(t, opts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The controller under its issued credentials.
	copts := fleetController(t, s)
	copts.Creds = filepath.Join(dir, "controller.creds")
	errs := make(chan error, 1)
	startController(t, ctx, copts, errs)

	t.Setenv("MESHBUILD_CREDS", "")
	t.Setenv("MESHBUILD_STATE", "")
	// Not this machine's own farm's: a `builds up` run here keeps its
	// operator's credentials in ~/.local/state/meshbuild/up.
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	if code, _, errw := run(t, "--nats", s.ClientURL(), "plans"); code != 1 || !strings.Contains(errw, "wants credentials") {
		t.Errorf("builds plans without credentials: exit %d, %q", code, errw)
	}
	t.Setenv("MESHBUILD_STATE", state)
	if code, out, errw := run(t, "--nats", s.ClientURL(), "plans"); code != 0 {
		t.Errorf("builds plans with the operator's credentials from MESHBUILD_STATE: exit %d\n%s\n%s", code, out, errw)
	}
	if code, _, errw := run(t, "--nats", s.ClientURL(), "--tls-cert", filepath.Join(dir, "m1.creds"), "plans"); code != 1 || !strings.Contains(errw, "--tls-key") {
		t.Errorf("--tls-cert without --tls-key: exit %d, %q", code, errw)
	}
	// Another principal's credentials, on the server that issued them:
	// refused by name before anything is asked (the server would refuse
	// each request, or leave it to time out, and say only that).
	for file, whose := range map[string]string{"agent.creds": "agent_m1", "m1.creds": "node_m1", "controller.creds": "controller", "git.creds": "module_git"} {
		for _, args := range [][]string{{"plans"}, {"state", "keys", "build-agent.builds"}} {
			args = append([]string{"--nats", s.ClientURL(), "--creds", filepath.Join(dir, file)}, args...)
			if code, _, errw := run(t, args...); code != 1 || !strings.Contains(errw, "are "+whose+"'s, and builds speaks as the operator") || !strings.Contains(errw, "operator.creds") {
				t.Errorf("builds %v: exit %d, %q; want refused, naming %s and the operator's", args, code, errw, whose)
			}
		}
	}
}

// credsPublish is what a credentials file's JWT allows publishing.
func credsPublish(t *testing.T, file string) []string {
	t.Helper()
	uc, err := creds.UserClaims(file)
	if err != nil {
		t.Fatal(err)
	}
	return uc.Pub.Allow
}
