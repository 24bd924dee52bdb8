package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/state"
)

// The build agent keeps its records through the surface its node runtime
// hands it; on its own, through its bucket on its own connection when its
// credentials (the build-agent module's derived set) reach it; and without
// the bucket it runs without records, saying so once.
func TestTheAgentFindsWhereToKeepItsRecords(t *testing.T) {
	cat := meshtest.Catalogue(t, nil)
	agentMod, _ := cat.Module(mesh.AgentModule)
	perms, err := cat.MachinePermissions("m1")
	if err != nil {
		t.Fatal(err)
	}
	s := natstest.Server(t, &server.Options{Users: []*server.User{
		{Username: "admin", Password: "pw"},
		{Username: perms.Principal, Password: "pw", Permissions: perms.ServerPermissions()},
	}})
	_, admin := natstest.Connect(t, s, nats.UserInfo("admin", "pw"))
	_, js := natstest.Connect(t, s, nats.UserInfo(perms.Principal, "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix(perms.Principal)))
	ctx := context.Background()
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	// Carried by a node: the runtime's surface, as it is.
	carried := state.New(admin, mesh.AgentModule, cat.IssuedBuckets(agentMod))
	if got := agentState(state.NewContext(ctx, carried), js, "m1", log); got != carried {
		t.Errorf("carried: %v, want the runtime's surface", got)
	}
	// Carried, but its declaration issued no bucket: no records.
	if got := agentState(state.NewContext(ctx, state.New(admin, mesh.AgentModule, nil)), js, "m1", log); got != nil {
		t.Errorf("carried without the bucket issued: %v, want none", got)
	}
	if n := strings.Count(logs.String(), "running without keeping build records"); n != 1 {
		t.Errorf("said %d times that it keeps no records, want once:\n%s", n, logs.String())
	}
	// On its own, before the catalogue is raised: no bucket, no records.
	if got := agentState(ctx, js, "m1", log); got != nil {
		t.Errorf("no bucket: %v, want none", got)
	}
	if n := strings.Count(logs.String(), "running without keeping build records"); n != 2 {
		t.Errorf("said %d times that it keeps no records, want once each time:\n%s", n, logs.String())
	}
	// Raised: its own credentials write its bucket.
	if _, err := mesh.Raise(ctx, admin, cat, 1); err != nil {
		t.Fatal(err)
	}
	got := agentState(ctx, js, "m1", log)
	if got == nil {
		t.Fatalf("on its own with the bucket raised: no surface\n%s", logs.String())
	}
	if _, err := got.Put(ctx, mesh.AgentBuildsBucket, mesh.BuildRecordKey("app", "m1"), []byte(`{"module":"app"}`)); err != nil {
		t.Errorf("writing a record on the agent's own credentials: %v", err)
	}
}
