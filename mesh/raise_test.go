package mesh_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/mesh"
)

// fixture is a small catalogue with every kind of declaration: a seat with
// accepts, a controller holding a mesh seat, a user of the seat, a module
// with state and a reader of it.
func fixture() []*mesh.Manifest {
	return []*mesh.Manifest{
		{Module: "build-agent", Seats: []mesh.Seat{{
			Seat: "node-build-agent", Scope: "node", Accepts: []string{"build retain 7d"},
			Emits: []string{"started", "built", "failed", "log.*"}, Serves: []string{"status"},
		}}},
		{Module: "build-controller", Holds: []string{"mesh-controller"}, Uses: []string{"node-build-agent"},
			Consumes: []string{"mesh-git.pushed", "node-build-agent.started", "node-build-agent.built", "node-build-agent.failed", "shop.order.placed"},
			State:    []mesh.Bucket{{Name: "plans", History: 1}, {Name: "declarations", History: 1}}},
		{Module: "git", Holds: []string{"mesh-git"}},
		{Module: "shop", Emits: []string{"order.placed"}, Uses: []string{"node-build-agent"}, Reads: []string{"build-controller.plans"}},
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// snapshot reads back every stream, consumer and bucket config of a wire.
func snapshot(t *testing.T, js jetstream.JetStream, w mesh.Wire) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, s := range w.Streams {
		st, err := js.Stream(ctx(t), s.Config.Name)
		if err != nil {
			t.Fatalf("stream %s: %v", s.Config.Name, err)
		}
		out["stream "+s.Config.Name] = st.CachedInfo().Config
	}
	for _, c := range w.Consumers {
		cons, err := js.Consumer(ctx(t), c.Stream, c.Config.Durable)
		if err != nil {
			t.Fatalf("consumer %s/%s: %v", c.Stream, c.Config.Durable, err)
		}
		out["consumer "+c.Stream+"/"+c.Config.Durable] = cons.CachedInfo().Config
	}
	for _, b := range w.Buckets {
		st, err := js.Stream(ctx(t), mesh.KVStream(b.Config.Bucket))
		if err != nil {
			t.Fatalf("bucket %s: %v", b.Config.Bucket, err)
		}
		out["bucket "+b.Config.Bucket] = st.CachedInfo().Config
	}
	return out
}

func TestRaiseTwiceChangesNothing(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	c := mesh.NewCatalogue(fixture())

	first, err := mesh.Raise(ctx(t), js, c, 1)
	if err != nil {
		t.Fatal(err)
	}
	w := c.Derive(1)
	if got, want := len(first.Created), len(w.Streams)+len(w.Consumers)+len(w.Buckets); got != want {
		t.Fatalf("first raise created %d names, want %d: %v", got, want, first.Created)
	}
	before := snapshot(t, js, w)

	second, err := mesh.Raise(ctx(t), js, c, 1)
	if err != nil {
		t.Fatal(err)
	}
	if second.Changed() {
		t.Fatalf("second raise changed the server: created %v updated %v", second.Created, second.Updated)
	}
	if len(second.Unchanged) != len(first.Created) {
		t.Fatalf("second raise saw %d unchanged, want %d", len(second.Unchanged), len(first.Created))
	}
	if after := snapshot(t, js, w); !reflect.DeepEqual(before, after) {
		t.Fatalf("configs differ after a second raise:\nbefore %v\nafter  %v", before, after)
	}
}

func TestRaiseReportsRemovedDeclarationsAndKeepsThem(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	if _, err := mesh.Raise(ctx(t), js, mesh.NewCatalogue(fixture()), 1); err != nil {
		t.Fatal(err)
	}
	// Drop the seat's declaration and the controller's state and consumes.
	ms := fixture()
	ms[0].Seats = nil
	ms[1].State = nil
	ms[1].Consumes = nil
	r, err := mesh.Raise(ctx(t), js, mesh.NewCatalogue(ms), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"stream " + mesh.SeatStream("node-build-agent"),
		"bucket " + mesh.KVBucket("build-controller", "plans"),
		"bucket " + mesh.KVBucket("build-controller", "declarations"),
		"consumer " + mesh.EventsStream + "/" + mesh.ModuleConsumer("build-controller"),
	} {
		if !slices.Contains(r.Orphans, want) {
			t.Errorf("orphans %v lack %q", r.Orphans, want)
		}
	}
	if _, err := js.Stream(ctx(t), mesh.SeatStream("node-build-agent")); err != nil {
		t.Errorf("the orphaned work queue was deleted: %v", err)
	}
	if _, err := js.KeyValue(ctx(t), mesh.KVBucket("build-controller", "plans")); err != nil {
		t.Errorf("the orphaned bucket was deleted: %v", err)
	}
}

func TestAsksQueueUntilAHolderAppears(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	c := mesh.NewCatalogue(fixture())
	if _, err := mesh.Raise(ctx(t), js, c, 1); err != nil {
		t.Fatal(err)
	}
	subj := mesh.BuildSubject(mesh.DefaultPlatform)
	const n = 5
	for i := range n {
		if _, err := js.Publish(ctx(t), subj, fmt.Appendf(nil, "ask-%d", i), jetstream.WithMsgID(fmt.Sprintf("ask-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// A re-submit with the same id is a no-op.
	if ack, err := js.Publish(ctx(t), subj, []byte("ask-0"), jetstream.WithMsgID("ask-0")); err != nil || !ack.Duplicate {
		t.Fatalf("re-submit: ack %+v err %v, want a duplicate", ack, err)
	}
	// The holder arrives later: it binds the derived consumer by name.
	cons, err := js.Consumer(ctx(t), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range batch.Messages() {
			got = append(got, string(m.Data()))
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		}
		if len(got) != 1 || got[0] != fmt.Sprintf("ask-%d", i) {
			t.Fatalf("fetch %d got %v, want [ask-%d]", i, got, i)
		}
	}
}

// principals configures one NATS user per derived permission set.
func principals(t *testing.T, c *mesh.Catalogue) (urlOf func(user string) string, connect func(user string) (*nats.Conn, jetstream.JetStream, <-chan error)) {
	t.Helper()
	var sets []mesh.Permissions
	for _, m := range c.Modules {
		sets = append(sets, c.ModulePermissions(m))
	}
	sets = append(sets, c.ControllerPermissions("controller"), c.OperatorPermissions(mesh.OperatorPrincipal))
	if _, ok := c.Module(mesh.AgentModule); ok {
		for _, m := range testMachines {
			p, err := c.MachinePermissions(m)
			if err != nil {
				t.Fatal(err)
			}
			sets = append(sets, p)
		}
	}
	opts := &natsServerOptions{}
	for _, p := range sets {
		opts.add(p)
	}
	s := natstest.Server(t, opts.options())
	connect = func(user string) (*nats.Conn, jetstream.JetStream, <-chan error) {
		errs := make(chan error, 64)
		user = testPrincipal(user)
		nc, js := natstest.Connect(t, s, nats.UserInfo(user, "pw-"+user),
			nats.CustomInboxPrefix(mesh.InboxPrefix(user)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case errs <- err:
				default:
				}
			}))
		return nc, js, errs
	}
	return func(string) string { return s.ClientURL() }, connect
}

// testMachines are the build machines principals issues credentials to.
var testMachines = []string{"m1", "m2"}

// testPrincipal is the principal id a test names: a machine of
// testMachines, the controller, or a module.
func testPrincipal(name string) string {
	switch {
	case name == mesh.ControllerPrincipal, name == mesh.OperatorPrincipal:
		return name
	case slices.Contains(testMachines, name):
		return mesh.PrincipalID(mesh.KindAgent, name)
	}
	return mesh.PrincipalID(mesh.KindModule, name)
}

// refused waits for the server to refuse an operation on subject.
func refused(t *testing.T, errs <-chan error, subject string) {
	t.Helper()
	deadline := time.After(3 * time.Second)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) && containsSubject(err, subject) {
				return
			}
		case <-deadline:
			t.Fatalf("no permissions violation for %q", subject)
		}
	}
}

func TestDerivedPermissionsOnARealServer(t *testing.T) {
	c := mesh.NewCatalogue(fixture())
	_, connect := principals(t, c)

	// The controller raises under its own derived grant.
	_, cjs, _ := connect("controller")
	if _, err := mesh.Raise(ctx(t), cjs, c, 1); err != nil {
		t.Fatalf("controller raising under its grant: %v", err)
	}

	ask := mesh.BuildSubject(mesh.DefaultPlatform)
	t.Run("a user of a seat publishes asks and nothing else of it", func(t *testing.T) {
		nc, js, errs := connect("shop")
		if _, err := js.Publish(ctx(t), ask, []byte("{}")); err != nil {
			t.Fatalf("shop publishing an ask: %v", err)
		}
		sub, err := nc.SubscribeSync(ask)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		refused(t, errs, ask)
		built := mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, "built")
		if err := nc.Publish(built, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		refused(t, errs, built)
		other := mesh.ModuleEventSubject("git", "rotated")
		if err := nc.Publish(other, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		refused(t, errs, other)
	})

	t.Run("the operator reads who holds the controller's seat and no other claim", func(t *testing.T) {
		// By hand, `builds push` with no answer from the controller
		// could not read the seat's claim ("permissions violation for
		// Publish to $JS.API.DIRECT.GET.KV_CLAIMS…") and took a busy
		// controller for none.
		_, cjs, _ := connect("controller")
		lease, err := claim.Claim(ctx(t), cjs, mesh.ControllerSeat, claim.Mesh(), "build-controller on test pid 1")
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(context.Background())
		_, mjs, _ := connect("m1")
		m1, err := claim.Claim(ctx(t), mjs, mesh.BuildSeat, claim.Node("m1"), "build-agent on m1")
		if err != nil {
			t.Fatal(err)
		}
		defer m1.Release(context.Background())
		_, ojs, errs := connect(mesh.OperatorPrincipal)
		rec, ok, err := claim.Current(ctx(t), ojs, mesh.ControllerSeat, claim.Mesh())
		if err != nil || !ok || rec.Holder != "build-controller on test pid 1" {
			t.Fatalf("the operator reading the controller's seat: %+v, %v, %v", rec, ok, err)
		}
		short, cancel := context.WithTimeout(context.Background(), 2*time.Second) // refused: no answer comes
		defer cancel()
		if _, ok, err := claim.Current(short, ojs, mesh.BuildSeat, claim.Node("m1")); err == nil || ok {
			t.Errorf("the operator read m1's claim: ok %v, err %v", ok, err)
		}
		refused(t, errs, "$JS.API.DIRECT.GET."+mesh.KVStream(mesh.ClaimsBucket())+"."+mesh.KVKeySubject(mesh.ClaimsBucket(), mesh.ClaimKey(mesh.BuildSeat, "m1")))
	})

	t.Run("a holder fetches and acks under exactly its grant", func(t *testing.T) {
		_, js, _ := connect("m1")
		cons, err := js.Consumer(ctx(t), mesh.SeatStream(mesh.BuildSeat), mesh.BuildConsumer(mesh.DefaultPlatform))
		if err != nil {
			t.Fatalf("holder binding its consumer: %v", err)
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if err := m.DoubleAck(ctx(t)); err != nil {
				t.Fatalf("holder acking: %v", err)
			}
		}
		if n != 1 {
			t.Fatalf("holder fetched %d asks, want 1 (err %v)", n, batch.Error())
		}
		info, err := cons.Info(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending != 0 || info.AckFloor.Stream == 0 {
			t.Fatalf("ack not recorded: pending %d floor %d", info.NumAckPending, info.AckFloor.Stream)
		}
		if _, err := js.Publish(ctx(t), mesh.HolderEventSubject(mesh.BuildSeat, "m1", "built"), []byte("{}")); err != nil {
			t.Fatalf("holder announcing built: %v", err)
		}
		// It speaks for itself only: not for m2, not on the seat's bare
		// subject.
		for _, other := range []string{mesh.HolderEventSubject(mesh.BuildSeat, "m2", "built"), mesh.HolderEventSubject(mesh.BuildSeat, mesh.AnyHolder, "built")} {
			short, cancel := context.WithTimeout(ctx(t), time.Second)
			_, err := js.Publish(short, other, []byte("{}"))
			cancel()
			if err == nil {
				t.Fatalf("machine m1 published on %s", other)
			}
		}
	})

	t.Run("a reader reads a bucket and cannot write it", func(t *testing.T) {
		bucket := mesh.KVBucket("build-controller", "plans")
		_, cjs, _ := connect("controller")
		ckv, err := cjs.KeyValue(ctx(t), bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ckv.Put(ctx(t), "p1", []byte("v1")); err != nil {
			t.Fatalf("owner writing: %v", err)
		}
		_, js, errs := connect("shop")
		kv, err := js.KeyValue(ctx(t), bucket)
		if err != nil {
			t.Fatalf("reader opening the bucket: %v", err)
		}
		e, err := kv.Get(ctx(t), "p1")
		if err != nil || string(e.Value()) != "v1" {
			t.Fatalf("reader get: %v %v", e, err)
		}
		short, cancel := context.WithTimeout(ctx(t), 2*time.Second)
		defer cancel()
		if _, err := kv.Put(short, "p1", []byte("forged")); err == nil {
			t.Fatal("reader wrote a bucket it only reads")
		}
		refused(t, errs, "$KV."+bucket+".p1")
		e, _ = ckv.Get(ctx(t), "p1")
		if string(e.Value()) != "v1" {
			t.Fatalf("value changed to %q", e.Value())
		}
	})

	t.Run("the controller receives every event it follows", func(t *testing.T) {
		ms, _ := c.Module("build-controller")
		_, ajs, _ := connect("m1")
		_, gjs, _ := connect("git")
		_, sjs, _ := connect("shop")
		publishers := map[string]jetstream.JetStream{"node-build-agent": ajs, "mesh-git": gjs, "shop": sjs}
		want := map[string]bool{}
		for _, ref := range ms.Consumes {
			emitter, _, _ := mesh.SplitRef(ref)
			subj, _ := c.ConsumedSubject(ref)
			if s, _, ok := c.Seat(emitter); ok && s.Scope == mesh.ScopeNode {
				_, _, event, _ := mesh.SplitHolderEventSubject(subj)
				subj = mesh.HolderEventSubject(emitter, "m1", event)
			}
			if _, err := publishers[emitter].Publish(ctx(t), subj, []byte(ref)); err != nil {
				t.Fatalf("%s publishing %s: %v", emitter, subj, err)
			}
			want[ref] = true
		}
		cons, err := cjs.Consumer(ctx(t), mesh.EventsStream, mesh.ModuleConsumer("build-controller"))
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		deadline := time.Now().Add(10 * time.Second)
		for len(got) < len(want) && time.Now().Before(deadline) {
			batch, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for m := range batch.Messages() {
				got[string(m.Data())] = true
				if err := m.Ack(); err != nil {
					t.Fatal(err)
				}
			}
		}
		// The holder's own "built" from the subtest above arrives too.
		for ref := range want {
			if !got[ref] {
				t.Errorf("controller never received %s", ref)
			}
		}
	})
}

// A seat's ask claims bucket never refuses a new claim for room: full, it
// drops its oldest claims (settled ones, long past their asks). Refusing
// instead (a bucket's default), a fleet that settled some 60,000 asks
// inside the week its claims are kept had every new claim refused and
// every ask fail. Checked on a real server, through Raise (and again after
// a second raise, which asserts the bucket anew), with the bucket's limit
// lowered so that it fills quickly.
func TestAFullAskClaimsBucketDropsItsOldestClaims(t *testing.T) {
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	c := mesh.NewCatalogue(fixture())
	for range 2 {
		if _, err := mesh.Raise(ctx(t), js, c, 1); err != nil {
			t.Fatal(err)
		}
	}
	bucket := mesh.AskClaimsBucket("node-build-agent")
	st, err := js.Stream(ctx(t), mesh.KVStream(bucket))
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Discard != jetstream.DiscardOld {
		t.Fatalf("the ask claims bucket's stream discards %v, want the oldest", cfg.Discard)
	}
	cfg.MaxBytes = 64 << 10
	if _, err := js.UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bucket)
	if err != nil {
		t.Fatal(err)
	}
	claim := make([]byte, 1<<10)
	const n = 256 // four times what the bucket holds
	for i := range n {
		if _, err := kv.Create(ctx(t), fmt.Sprintf("ask-%03d", i), claim); err != nil {
			t.Fatalf("claim %d of %d refused: %v", i+1, n, err)
		}
	}
	if _, err := kv.Get(ctx(t), "ask-000"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the oldest claim: %v, want it dropped", err)
	}
	if _, err := kv.Get(ctx(t), fmt.Sprintf("ask-%03d", n-1)); err != nil {
		t.Errorf("the newest claim: %v", err)
	}
	// A claim still taken is not taken twice.
	if _, err := kv.Create(ctx(t), fmt.Sprintf("ask-%03d", n-1), claim); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Errorf("creating a live claim again: %v, want it refused as existing", err)
	}
}

// TestRaiseReplacesAHoldersConsumerKeptInTheOtherStore: a holders' consumer
// keeps its state in memory on a cluster and on file on one server
// (mesh.HolderStateInMemory). The server refuses to change that in place,
// so the raise makes the consumer anew; the new one delivers again what the
// old one had delivered and not seen acknowledged, never what was
// acknowledged (the queue is a work queue).
func TestRaiseReplacesAHoldersConsumerKeptInTheOtherStore(t *testing.T) {
	if mesh.HolderStateInMemory(1) || !mesh.HolderStateInMemory(3) {
		t.Fatal("HolderStateInMemory: want memory on a cluster of three and file on one server")
	}
	s := natstest.Server(t, nil)
	_, js := natstest.Connect(t, s)
	c := mesh.NewCatalogue(fixture())
	if _, err := mesh.Raise(ctx(t), js, c, 1); err != nil {
		t.Fatal(err)
	}
	spec := mesh.BuildConsumerSpec(mesh.DefaultPlatform, 1)
	if spec.Config.MemoryStorage {
		t.Fatalf("consumer %s at one replica keeps its state in memory, want on file", spec.Config.Durable)
	}
	if cs := mesh.BuildConsumerSpec(mesh.DefaultPlatform, 3); !cs.Config.MemoryStorage {
		t.Fatalf("consumer %s at three replicas keeps its state on file, want in memory", cs.Config.Durable)
	}
	// As a cluster's raise left it: in memory.
	if err := js.DeleteConsumer(ctx(t), spec.Stream, spec.Config.Durable); err != nil {
		t.Fatal(err)
	}
	mem := spec.Config
	mem.MemoryStorage = true
	old, err := js.CreateConsumer(ctx(t), spec.Stream, mem)
	if err != nil {
		t.Fatal(err)
	}
	for _, ask := range []string{"acknowledged", "held"} {
		if _, err := js.Publish(ctx(t), mesh.BuildSubject(mesh.DefaultPlatform), []byte(ask)); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := old.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var delivered []string
	for msg := range batch.Messages() {
		delivered = append(delivered, string(msg.Data()))
		if string(msg.Data()) == "acknowledged" {
			if err := msg.DoubleAck(ctx(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(delivered) != 2 {
		t.Fatalf("the old consumer delivered %v, want both asks", delivered)
	}

	r, err := mesh.Raise(ctx(t), js, c, 1)
	if err != nil {
		t.Fatalf("raising over a holders' consumer kept in memory: %v", err)
	}
	name := "consumer " + spec.Stream + "/" + spec.Config.Durable
	if !slices.Contains(r.Updated, name) {
		t.Errorf("the raise's report updated %v, want %s among them", r.Updated, name)
	}
	cons, err := js.Consumer(ctx(t), spec.Stream, spec.Config.Durable)
	if err != nil {
		t.Fatal(err)
	}
	if cons.CachedInfo().Config.MemoryStorage {
		t.Fatalf("after the raise consumer %s keeps its state in memory, want on file", spec.Config.Durable)
	}
	batch, err = cons.Fetch(2, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var again []string
	for msg := range batch.Messages() {
		again = append(again, string(msg.Data()))
	}
	if !slices.Equal(again, []string{"held"}) {
		t.Fatalf("the new consumer delivered %v, want the held ask again and not the acknowledged one", again)
	}
	if second, err := mesh.Raise(ctx(t), js, c, 1); err != nil || second.Changed() {
		t.Fatalf("raising again: %v, updated %v, want nothing changed", err, second.Updated)
	}
}

// A server with less file storage left than the catalogue's streams and
// buckets reserve refuses one of them: the error says how much they
// reserve, of what, and what to do (by hand, `builds up` on a small disk
// said only "insufficient storage resources available" and stopped).
// Nothing is raised past it; given room, the same raise goes through.
func TestAServerWithTooLittleStorageIsSaidSo(t *testing.T) {
	c := mesh.NewCatalogue(fixture())
	w := c.Derive(1)
	total, parts := w.Reserved()
	if total <= mesh.LogsMaxBytes || !strings.Contains(parts, "buckets of 64 MiB") {
		t.Fatalf("reserved %d (%s): want LOGS and the buckets", total, parts)
	}
	s := natstest.Server(t, &server.Options{JetStreamMaxStore: total / 2})
	_, js := natstest.Connect(t, s)
	_, err := mesh.Raise(ctx(t), js, c, 1)
	if err == nil {
		t.Fatal("raised on a server with half the storage the catalogue reserves")
	}
	for _, want := range []string{"insufficient storage resources available", fmt.Sprintf("%d MiB in all (%s)", total>>20, parts), "max_file_store", "--state"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	roomy := natstest.Server(t, &server.Options{JetStreamMaxStore: total + 1<<20})
	_, js = natstest.Connect(t, roomy)
	if _, err := mesh.Raise(ctx(t), js, c, 1); err != nil {
		t.Fatalf("raise with room: %v", err)
	}
}
