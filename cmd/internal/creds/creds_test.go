package creds_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
)

// A key directory: every file only its owner's, not made twice, read back
// as made.
func TestInitOpen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	k, err := creds.Init(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{creds.OperatorSeed, creds.AccountSeed, creds.SystemSeed, creds.OperatorJWT, creds.AccountJWT, creds.SystemJWT, creds.ServerConf} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	if _, err := creds.Init(dir); !errors.Is(err, creds.ErrExists) {
		t.Errorf("Init again = %v, want ErrExists", err)
	}
	again, err := creds.Open(dir)
	if err != nil || again.Account() != k.Account() {
		t.Fatalf("Open = %v, %v; want account %s", again, err, k.Account())
	}
	if _, err := creds.Open(t.TempDir()); !errors.Is(err, creds.ErrNoKeys) {
		t.Errorf("Open of an empty directory = %v, want ErrNoKeys", err)
	}
	ensured, err := creds.Ensure(dir)
	if err != nil || ensured.Account() != k.Account() {
		t.Errorf("Ensure of a made directory = %v, %v; want the same keys", ensured, err)
	}
	os.WriteFile(filepath.Join(dir, creds.AccountSeed), []byte("not a seed\n"), 0o600)
	if _, err := creds.Open(dir); err == nil {
		t.Error("Open read a broken account seed")
	}
}

// newKeys makes a new key directory and the server options its
// server.conf holds.
func newKeys(t *testing.T) (*creds.Keys, *server.Options) {
	t.Helper()
	k, err := creds.Init(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts, err := k.ServerOptions()
	if err != nil {
		t.Fatal(err)
	}
	return k, opts
}

// issueFile issues principal kind name's credentials derived from cat into
// a file of its own, mode 0600, and returns its path and the set.
func issueFile(t *testing.T, k *creds.Keys, cat *mesh.Catalogue, kind, name string) (string, mesh.Permissions) {
	t.Helper()
	p, err := cat.PrincipalPermissions(kind, name)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), kind+".creds")
	if err := k.IssueFile(p, strings.TrimSpace(kind+" "+name), path); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	return path, p
}

// Credentials issued from a key directory, on a server configured from its
// server.conf: the user's JWT carries exactly the derived set, the server
// admits it with JetStream on and enforces the set; credentials from other
// keys are refused.
func TestIssuedCredentialsAreEnforced(t *testing.T) {
	k, opts := newKeys(t)
	if len(opts.TrustedOperators) != 1 || opts.AccountResolver == nil || opts.SystemAccount == "" {
		t.Fatalf("server.conf: operators %d, resolver %v, system account %q; want the operator, a resolver, a system account",
			len(opts.TrustedOperators), opts.AccountResolver, opts.SystemAccount)
	}
	s := natstest.Server(t, opts)

	cat := meshtest.Catalogue(t, map[string][]string{"a": nil})
	issue := func(kind, name string) (string, mesh.Permissions) { return issueFile(t, k, cat, kind, name) }

	// The JWT's permissions are the derived set, nothing added.
	nodeCreds, nodePerms := issue(mesh.KindNode, "m1")
	uc, err := creds.UserClaims(nodeCreds)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(uc.Pub.Allow, mesh.AllowList(nodePerms.Publish)) || !slices.Equal(uc.Sub.Allow, mesh.AllowList(nodePerms.Subscribe)) || uc.IssuerAccount != "" || uc.Issuer != k.Account() {
		t.Errorf("the node's JWT: pub %v sub %v issuer %s; want %v, %v signed by %s", uc.Pub.Allow, uc.Sub.Allow, uc.Issuer, nodePerms.Publish, nodePerms.Subscribe, k.Account())
	}

	// The controller raises a stream: the account has JetStream.
	ctrlCreds, _ := issue(mesh.KindController, "")
	_, cjs := natstest.Connect(t, s, nats.UserCredentials(ctrlCreds), nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.ControllerPrincipal)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec := mesh.NodesStreamSpec(1)
	if _, err := cjs.CreateStream(ctx, spec.Config); err != nil {
		t.Fatalf("the controller raising %s under its credentials: %v", spec.Config.Name, err)
	}
	if _, err := cjs.CreateConsumer(ctx, mesh.NodesStream, mesh.NodeConsumerSpec("m1", 1).Config); err != nil {
		t.Fatal(err)
	}

	// The node: its own consumer yes, a subscription beyond its set no.
	refused := make(chan error, 4)
	nnc, njs := natstest.Connect(t, s, nats.UserCredentials(nodeCreds), nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.PrincipalID(mesh.KindNode, "m1"))),
		nats.PermissionErrOnSubscribe(true), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refused <- err }))
	if _, err := njs.Consumer(ctx, mesh.NodesStream, mesh.NodeConsumer("m1")); err != nil {
		t.Errorf("node m1 binding its own consumer: %v", err)
	}
	// Fetching from m2's consumer is refused by the server.
	nnc.Publish("$JS.API.CONSUMER.MSG.NEXT."+mesh.NodesStream+"."+mesh.NodeConsumer("m2"), nil)
	select {
	case err := <-refused:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("node m1 fetching from m2's consumer: %v, want a permissions violation", err)
		}
	case <-ctx.Done():
		t.Fatal("node m1 fetching from m2's consumer was not refused")
	}
	other, err := nnc.SubscribeSync(mesh.NodeSubject("m2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.NextMsg(10 * time.Second); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Errorf("node m1 subscribing to m2's declarations: %v, want a permissions violation", err)
	}

	// Credentials from keys the server does not trust are refused.
	stranger, err := creds.Init(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "stranger.creds")
	if err := stranger.IssueFile(nodePerms, "stranger", path); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(s.ClientURL(), nats.UserCredentials(path)); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("credentials from other keys: %v, want an authorization violation", err)
	}
	// And so is a client without credentials.
	if nc, err := nats.Connect(s.ClientURL()); !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("no credentials: %v, want an authorization violation", err)
	}
}

// An empty allow list in a derived set denies everything: to the server an
// empty list would allow everything.
func TestEmptySetDeniesAll(t *testing.T) {
	k, opts := newKeys(t)
	s := natstest.Server(t, opts)
	path := filepath.Join(t.TempDir(), "nobody.creds")
	if err := k.IssueFile(mesh.Permissions{Principal: "nobody", Subscribe: []string{"_INBOX_nobody.>"}}, "", path); err != nil {
		t.Fatal(err)
	}
	refused := make(chan error, 1)
	nc, _ := natstest.Connect(t, s, nats.UserCredentials(path), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case refused <- err:
		default:
		}
	}))
	nc.Publish("anything", nil)
	select {
	case err := <-refused:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("publish under an empty set: %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a publish under an empty set was not refused")
	}
}

// A machine's credentials for a catalogue of many platforms, or a build
// seat of shards, fit a CONNECT a default server accepts (4 KB: with four
// platforms granted consumer by consumer none did, "maximum control line
// exceeded"), and let the machine bind its platforms' consumers, every
// shard's — and nothing beyond the seat's stream.
func TestManyPlatformsAndShardsCredentialsConnect(t *testing.T) {
	k, opts := newKeys(t)
	s := natstest.Server(t, opts)
	platforms := []string{"linux/amd64", "linux/arm64", "linux/arm/v7", "linux/386", "linux/ppc64le", "linux/s390x"}
	for _, shards := range []int{0, 40} {
		ms := meshtest.Sharded(meshtest.MeshManifests(t), shards)
		ms = append(ms, &mesh.Manifest{Module: "wide", Build: &mesh.Build{Repo: meshtest.FleetRepo, Path: "wide", Platforms: platforms}})
		cat := mesh.NewCatalogue(ms)
		issue := func(kind, name string) string {
			path, _ := issueFile(t, k, cat, kind, name)
			return path
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ctrl := issue(mesh.KindController, "")
		_, cjs := natstest.Connect(t, s, nats.UserCredentials(ctrl), nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.ControllerPrincipal)))
		if _, err := mesh.Raise(ctx, cjs, cat, 1); err != nil {
			t.Fatalf("shards %d: raising: %v", shards, err)
		}
		machine := "build-machine-eu-west-1a-0042"
		agentCreds := issue(mesh.KindAgent, machine)
		refused := make(chan error, 4)
		_, ajs := natstest.Connect(t, s, nats.UserCredentials(agentCreds), nats.CustomInboxPrefix(mesh.InboxPrefix(mesh.PrincipalID(mesh.KindAgent, machine))),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refused <- err }))
		n := max(shards, 1)
		for _, p := range platforms {
			for _, k := range []int{0, n - 1} {
				if _, err := ajs.Consumer(ctx, mesh.SeatStream(mesh.BuildSeat), mesh.BuildShardConsumer(p, k)); err != nil {
					t.Errorf("shards %d: the machine binding %s: %v", shards, mesh.BuildShardConsumer(p, k), err)
				}
			}
		}
		// Another stream's consumer stays out of reach.
		bctx, bcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := ajs.Consumer(bctx, mesh.EventsStream, "module-build-controller")
		bcancel()
		if err == nil {
			t.Errorf("shards %d: the machine bound the controller's consumer of %s", shards, mesh.EventsStream)
		}
		select {
		case err := <-refused:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("shards %d: %v, want a permissions violation", shards, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("shards %d: binding the controller's consumer was not refused", shards)
		}
	}
}

// Credentials a server of the default max_control_line refuses (a CONNECT
// carries the JWT) are past creds.ConnectJWTBudget, so that `creds issue`
// warns of them: for every principal of the mesh's own catalogue, of the
// example fleet's, and of one with a module built for six platforms. A
// machine's always connect.
func TestEveryPrincipalsCredentialsConnect(t *testing.T) {
	k, opts := newKeys(t)
	s := natstest.Server(t, opts)
	base := meshtest.MeshManifests(t)
	wide := append(meshtest.MeshManifests(t), &mesh.Manifest{Module: "wide", Build: &mesh.Build{Repo: meshtest.FleetRepo, Path: "wide",
		Platforms: []string{"linux/amd64", "linux/arm64", "linux/arm/v7", "linux/386", "linux/ppc64le", "linux/s390x"}}})
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	fleet, _, err := mesh.Load(filepath.Join(root, "examples/fleet/catalogue"))
	if err != nil {
		t.Fatal(err)
	}
	for name, ms := range map[string][]*mesh.Manifest{"mesh": base, "six platforms": wide, "examples/fleet": fleet.Modules} {
		cat := mesh.NewCatalogue(ms)
		kinds := [][2]string{{mesh.KindController, ""}, {mesh.KindOperator, ""}, {mesh.KindAgent, "build-machine-eu-west-1a-0042"}}
		for _, m := range cat.Modules {
			kinds = append(kinds, [2]string{mesh.KindModule, m.Module})
		}
		for _, kn := range kinds {
			path, _ := issueFile(t, k, cat, kn[0], kn[1])
			// A daemon names its connection (the machine's or module's
			// name, daemon.Connect): the CONNECT carries that too.
			nc, err := nats.Connect(s.ClientURL(), nats.UserCredentials(path), nats.Name("build-controller on build-machine-eu-west-1a-0042"))
			size, serr := creds.JWTSize(path)
			if serr != nil {
				t.Fatal(serr)
			}
			if err != nil {
				if size <= creds.ConnectJWTBudget {
					t.Errorf("%s: %s %s's credentials, a JWT of %d bytes within ConnectJWTBudget (no warning): %v", name, kn[0], kn[1], size, err)
				} else {
					t.Logf("%s: %s %s's credentials, %d bytes, need max_control_line raised (creds issue warns): %v", name, kn[0], kn[1], size, err)
				}
				if kn[0] == mesh.KindAgent {
					t.Errorf("%s: a machine's credentials do not connect: %v", name, err)
				}
				continue
			}
			nc.Close()
		}
	}
}
