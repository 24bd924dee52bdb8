package state_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/state"
)

// world is a real server enforcing derived permissions: the catalogue has
// an owner of state "builds", a reader of owner.builds, and a module with
// no state; node n1 carries owner and reader, n2 only reader.
type world struct {
	t       *testing.T
	cat     *mesh.Catalogue
	s       *server.Server
	ctx     context.Context
	admin   jetstream.JetStream
	refused chan error
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ms := append(meshtest.MeshManifests(t),
		&mesh.Manifest{Module: "owner", State: []mesh.Bucket{{Name: "builds"}}},
		&mesh.Manifest{Module: "reader", Reads: []string{"owner.builds"}},
		&mesh.Manifest{Module: "plain", Emits: []string{"hello"}},
	)
	if ps := mesh.Check(ms); mesh.HasErrors(ps) {
		t.Fatalf("catalogue: %v", ps)
	}
	cat := mesh.NewCatalogue(ms)
	users := []*server.User{{Username: "admin", Password: "pw"}}
	for _, p := range []mesh.Permissions{
		cat.NodeStatePermissions("n1", []string{"owner", "reader"}),
		cat.NodeStatePermissions("n2", []string{"reader"}),
		cat.OperatorPermissions("operator"),
	} {
		users = append(users, &server.User{Username: p.Principal, Password: "pw", Permissions: p.ServerPermissions()})
	}
	s := natstest.Server(t, &server.Options{Users: users})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	w := &world{t: t, cat: cat, s: s, ctx: ctx, refused: make(chan error, 16)}
	_, w.admin = natstest.Connect(t, s, nats.UserInfo("admin", "pw"))
	if _, err := mesh.Raise(ctx, w.admin, cat, 1); err != nil {
		t.Fatal(err)
	}
	return w
}

// js connects as a principal (a node by its name); the server's refusals
// go to w.refused.
func (w *world) js(user string) jetstream.JetStream {
	if user == "n1" || user == "n2" {
		user = mesh.PrincipalID(mesh.KindNode, user)
	}
	_, js := natstest.Connect(w.t, w.s, nats.UserInfo(user, "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix(user)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case w.refused <- err:
			default:
			}
		}))
	return js
}

// store is module's state surface on node's connection, issued what the
// catalogue derives for it.
func (w *world) store(node, module string) *state.Store {
	m, ok := w.cat.Module(module)
	if !ok {
		w.t.Fatalf("no module %s", module)
	}
	return state.New(w.js(node), module, w.cat.IssuedBuckets(m))
}

func (w *world) noRefusals() {
	w.t.Helper()
	select {
	case err := <-w.refused:
		w.t.Fatalf("the server refused a principal: %v", err)
	default:
	}
}

func TestIssuedBucketsAreOwnStateReadWriteAndReadsReadOnly(t *testing.T) {
	w := newWorld(t)
	owner, _ := w.cat.Module("owner")
	reader, _ := w.cat.Module("reader")
	if got, want := w.cat.IssuedBuckets(owner), []mesh.IssuedBucket{{Name: "builds", Bucket: "owner_builds", Write: true}}; !slices.Equal(got, want) {
		t.Errorf("owner is issued %v, want %v", got, want)
	}
	if got, want := w.cat.IssuedBuckets(reader), []mesh.IssuedBucket{{Name: "owner.builds", Bucket: "owner_builds"}}; !slices.Equal(got, want) {
		t.Errorf("reader is issued %v, want %v", got, want)
	}
	n2 := w.cat.NodeStatePermissions("n2", []string{"reader"})
	if slices.Contains(n2.Publish, mesh.KVSubjects("owner_builds")) {
		t.Errorf("a node carrying only the reader may write the bucket: %v", n2.Publish)
	}
	n1 := w.cat.NodeStatePermissions("n1", []string{"owner", "reader"})
	if !slices.Contains(n1.Publish, mesh.KVSubjects("owner_builds")) {
		t.Errorf("a node carrying the owner may not write the bucket: %v", n1.Publish)
	}
	for _, g := range mesh.NodePermissions("n1").Publish {
		if !slices.Contains(n1.Publish, g) {
			t.Errorf("the node's state set lost its own grant %s", g)
		}
	}
}

// TestOwnerWritesReaderOnlyReads: over a real, enforcing bus, the owner
// writes and reads, the reader reads and is refused a write by the runtime
// at once — with the reason — where the server alone would only let it time
// out; a bucket not issued is refused by name.
func TestOwnerWritesReaderOnlyReads(t *testing.T) {
	w := newWorld(t)
	owner := w.store("n1", "owner")
	reader := w.store("n2", "reader")
	ctx := w.ctx

	if _, err := owner.Put(ctx, "builds", "app", []byte(`{"at":"2026-10-04T10:00:00Z"}`)); err != nil {
		t.Fatalf("owner put: %v", err)
	}
	e, err := reader.Get(ctx, "owner.builds", "app")
	if err != nil || !strings.Contains(string(e.Value), "2026-10-04") {
		t.Fatalf("reader get: %q, %v", e.Value, err)
	}
	if keys, err := reader.Keys(ctx, "owner.builds"); err != nil || !slices.Equal(keys, []string{"app"}) {
		t.Fatalf("reader keys: %v, %v", keys, err)
	}

	start := time.Now()
	_, err = reader.Put(ctx, "owner.builds", "app", []byte(`{}`))
	if !errors.Is(err, state.ErrReadOnly) || !strings.Contains(err.Error(), "reader") || !strings.Contains(err.Error(), "owner.builds") {
		t.Fatalf("reader put: %v, want ErrReadOnly naming the module and bucket", err)
	}
	if err := reader.Delete(ctx, "owner.builds", "app"); !errors.Is(err, state.ErrReadOnly) {
		t.Fatalf("reader delete: %v, want ErrReadOnly", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the refusals took %v: they must be the runtime's, not the server's timeout", took)
	}
	for _, call := range []func() error{
		func() error { _, err := reader.Get(ctx, "builds", "app"); return err },
		func() error { _, err := owner.Keys(ctx, "other.things"); return err },
		func() error { _, err := owner.Watch(ctx, "nope"); return err },
	} {
		if err := call(); !errors.Is(err, state.ErrNotIssued) || !strings.Contains(err.Error(), "issued:") {
			t.Errorf("a bucket not issued: %v, want ErrNotIssued listing what is issued", err)
		}
	}
	if _, err := owner.Get(ctx, "builds", "missing"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("a missing key: %v, want ErrNotFound", err)
	}
	if err := owner.Delete(ctx, "builds", "app"); err != nil {
		t.Fatalf("owner delete: %v", err)
	}
	if keys, err := owner.Keys(ctx, "builds"); err != nil || len(keys) != 0 {
		t.Fatalf("keys after delete: %v, %v", keys, err)
	}
	w.noRefusals()

	// What the runtime spares the module: the server refuses n2's write,
	// and the client hears only a timeout.
	tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	kv, err := w.js("n2").KeyValue(tctx, "owner_builds")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(tctx, "app", []byte("{}")); err == nil || errors.Is(err, state.ErrReadOnly) {
		t.Fatalf("a raw write by the reader's node: %v, want the server's refusal", err)
	}
	select {
	case err := <-w.refused:
		if !strings.Contains(err.Error(), "$KV.owner_builds.app") {
			t.Fatalf("the server refused %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not refuse the reader's node a write")
	}
}

// TestWatchDeliversCurrentThenMarkerThenChanges: current values first with
// no deletions, then one Current, then every change including deletions;
// Stop closes the channel.
func TestWatchDeliversCurrentThenMarkerThenChanges(t *testing.T) {
	w := newWorld(t)
	owner := w.store("n1", "owner")
	reader := w.store("n2", "reader")
	ctx := w.ctx
	for _, k := range []string{"a", "b", "gone"} {
		if _, err := owner.Put(ctx, "builds", k, []byte(`"`+k+`"`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := owner.Delete(ctx, "builds", "gone"); err != nil {
		t.Fatal(err)
	}
	wa, err := reader.Watch(ctx, "owner.builds")
	if err != nil {
		t.Fatal(err)
	}
	next := func() state.Event {
		t.Helper()
		select {
		case e, ok := <-wa.Events():
			if !ok {
				t.Fatal("the watch closed early")
			}
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("no watch event in 10s")
		}
		return state.Event{}
	}
	var got []string
	for {
		e := next()
		got = append(got, string(e.Kind)+":"+e.Key)
		if e.Kind == state.Current {
			break
		}
	}
	if want := []string{"value:a", "value:b", "current:"}; !slices.Equal(got, want) {
		t.Fatalf("current values %v, want %v (no deletion before the marker)", got, want)
	}
	if _, err := owner.Put(ctx, "builds", "c", []byte(`"c"`)); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Kind != state.Value || e.Key != "c" || string(e.Value) != `"c"` {
		t.Fatalf("after the marker: %+v, want c's value", e)
	}
	if err := owner.Delete(ctx, "builds", "a"); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Kind != state.Deleted || e.Key != "a" {
		t.Fatalf("after a delete: %+v, want a deleted", e)
	}
	wa.Stop()
	for range wa.Events() {
	}
	wa.Stop() // again: nothing

	// An empty bucket: the marker at once.
	if err := owner.Delete(ctx, "builds", "b"); err != nil {
		t.Fatal(err)
	}
	_ = owner.Delete(ctx, "builds", "c")
	we, err := owner.Watch(ctx, "builds")
	if err != nil {
		t.Fatal(err)
	}
	defer we.Stop()
	if e := <-we.Events(); e.Kind != state.Current {
		t.Fatalf("watching a bucket of deletions only: %+v first, want the marker", e)
	}
	w.noRefusals()
}

func TestCredentialNamedFieldIsRefusedNamingIt(t *testing.T) {
	w := newWorld(t)
	owner := w.store("n1", "owner")
	for value, field := range map[string]string{
		`{"apiKey":"x"}`:                               "apiKey",
		`{"API_KEY":"x"}`:                              "API_KEY",
		`{"api-key":"x"}`:                              "api-key",
		`{"db":{"privateKey":"x"}}`:                    "db.privateKey",
		`{"clients":[{"id":1},{"client_secret":"x"}]}`: "clients[1].client_secret",
		`{"Password":"x"}`:                             "Password",
		`{"auth":{"Token":"x"}}`:                       "auth",
		`[{"mcp":{"headers":{"Authorization":"x"}}}]`:  "[0].mcp.headers.Authorization",
	} {
		_, err := owner.Put(w.ctx, "builds", "k", []byte(value))
		if !errors.Is(err, state.ErrCredential) || !strings.Contains(err.Error(), "field "+field+" ") {
			t.Errorf("%s: %v, want ErrCredential naming %s", value, err, field)
		}
	}
	for _, ok := range []string{`{"module":"app","at":"2026-10-04T10:00:00Z","keys":["a"]}`, `not json: password=x`, `"token"`} {
		if _, err := owner.Put(w.ctx, "builds", "k", []byte(ok)); err != nil {
			t.Errorf("%s: refused: %v", ok, err)
		}
	}
}

// TestLimits: 256 KiB a value and 64 MiB a bucket, each refused naming the
// limit; one value per key, no expiry.
func TestLimits(t *testing.T) {
	w := newWorld(t)
	owner := w.store("n1", "owner")
	ctx := w.ctx
	big := bytes.Repeat([]byte("x"), mesh.BucketMaxValue+1)
	if _, err := owner.Put(ctx, "builds", "big", big); !errors.Is(err, state.ErrValueTooLarge) || !strings.Contains(err.Error(), "256 KiB a value") {
		t.Fatalf("a value over 256 KiB: %v, want ErrValueTooLarge naming the limit", err)
	}
	st, err := w.admin.Stream(ctx, mesh.KVStream("owner_builds"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxMsgsPerSubject != 1 || cfg.MaxAge != 0 || cfg.MaxBytes != mesh.BucketMaxBytes || cfg.MaxMsgSize != mesh.BucketMaxValue {
		t.Fatalf("the bucket keeps %d values a key, for %v, %d bytes, %d a value: want 1, forever, 64 MiB, 256 KiB",
			cfg.MaxMsgsPerSubject, cfg.MaxAge, cfg.MaxBytes, cfg.MaxMsgSize)
	}
	// Fill the bucket with values just under the limit, each its own key.
	value := bytes.Repeat([]byte("y"), mesh.BucketMaxValue-256)
	var full error
	for i := 0; i < mesh.BucketMaxBytes/len(value)+2; i++ {
		if _, err := owner.Put(ctx, "builds", fmt.Sprintf("k%d", i), value); err != nil {
			full = err
			break
		}
	}
	if !errors.Is(full, state.ErrBucketFull) || !strings.Contains(full.Error(), "64 MiB a bucket") {
		t.Fatalf("filling the bucket: %v, want ErrBucketFull naming the limit", full)
	}
	w.noRefusals()
}
