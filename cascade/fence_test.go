package cascade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/claim"
	"github.com/meshbuild/meshbuild/internal/natstest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/mesh/meshtest"
	"github.com/meshbuild/meshbuild/planner"
	"github.com/meshbuild/meshbuild/registry"
	"github.com/meshbuild/meshbuild/registry/registrytest"
)

// fenceFarm is a farm on a server that enforces every principal's derived
// set: the controller (checking digests in a real registry), build machines
// m1 and m2 with their own credentials, mesh-git's holder and an operator.
type fenceFarm struct {
	t          *testing.T
	s          *server.Server
	host       string
	cat        *mesh.Catalogue
	violations chan string
	refused    *refusals
	store      *cascade.Store
	ctx        context.Context
	cancel     context.CancelFunc
}

// refusals counts the controller's refusals by reason (RefusedObserver).
type refusals struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *refusals) PlanSettled(string, time.Duration) {}
func (r *refusals) Plans(map[string]int, int)         {}
func (r *refusals) RefusedEvent(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[reason]++
}
func (r *refusals) count(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

func newFenceFarm(t *testing.T, graph map[string][]string) *fenceFarm {
	t.Helper()
	cat := meshtest.Catalogue(t, graph)
	git, _ := cat.Module("git")
	sets := []mesh.Permissions{cat.ControllerPermissions(mesh.ControllerPrincipal), cat.OperatorPermissions(mesh.OperatorPrincipal), cat.ModulePermissions(git)}
	for _, m := range []string{"m1", "m2"} {
		p, err := cat.MachinePermissions(m)
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, p)
	}
	var users []*server.User
	for _, p := range sets {
		users = append(users, &server.User{Username: p.Principal, Password: "pw", Permissions: p.ServerPermissions()})
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &fenceFarm{t: t, s: natstest.Server(t, &server.Options{Users: users}), host: registrytest.Registry(t), cat: cat,
		violations: make(chan string, 64), refused: &refusals{n: map[string]int{}}, ctx: ctx, cancel: cancel}
	_, cjs := f.connect(mesh.ControllerPrincipal)
	cfg := cascade.DefaultConfig()
	cfg.Registry, cfg.RegistryClient = f.host, registry.NewClient(registry.WithInsecure(true))
	c, err := cascade.New(cfg, cjs, cat, testenv.Log(t, "controller"), f.refused)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	_, ojs := f.connect(mesh.OperatorPrincipal)
	testenv.WaitFor(t, 10*time.Second, "the controller to raise the catalogue", func() bool {
		f.store, err = cascade.OpenStore(ctx, ojs, "build-controller")
		return err == nil
	})
	return f
}

// connect dials as principal; the server's refusals go to f.violations.
func (f *fenceFarm) connect(principal string) (*nats.Conn, jetstream.JetStream) {
	return natstest.Connect(f.t, f.s, nats.UserInfo(principal, "pw"), nats.CustomInboxPrefix(mesh.InboxPrefix(principal)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case f.violations <- principal + ": " + err.Error():
			default:
			}
		}))
}

// agent runs machine's build agent, on its own credentials, with w.
func (f *fenceFarm) agent(machine string, w agent.Worker) {
	f.t.Helper()
	_, js := f.connect(mesh.PrincipalID(mesh.KindAgent, machine))
	cfg := agent.DefaultConfig()
	cfg.Machine, cfg.FetchWait = machine, 500*time.Millisecond
	a, err := agent.New(cfg, js, w, nil, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(f.ctx) }()
	f.t.Cleanup(func() { f.cancel(); <-done })
}

// push announces a push of commit as mesh-git's holder and returns its plan.
func (f *fenceFarm) push(commit string) string {
	f.t.Helper()
	_, gjs := f.connect(mesh.PrincipalID(mesh.KindModule, "git"))
	data, _ := json.Marshal(mesh.Pushed{Version: 1, Repo: meshtest.FleetRepo, Commit: commit, At: time.Now().UTC()})
	plan := planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: meshtest.FleetRepo, Commit: commit})
	if _, err := gjs.Publish(f.ctx, mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed), data, jetstream.WithMsgID(plan)); err != nil {
		f.t.Fatal(err)
	}
	return plan
}

// take pulls the next ask from the build queue as the machine js speaks
// for, and acknowledges its delivery as in progress.
func (f *fenceFarm) take(js jetstream.JetStream) mesh.Ask {
	f.t.Helper()
	seat, _, _ := f.cat.Seat(mesh.BuildSeat)
	cons, err := js.Consumer(f.ctx, mesh.SeatStream(mesh.BuildSeat), f.cat.HolderConsumers(seat)[0])
	if err != nil {
		f.t.Fatal(err)
	}
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		f.t.Fatal(err)
	}
	for m := range msgs.Messages() {
		_ = m.InProgress()
		a, err := mesh.DecodeAsk(m.Data())
		if err != nil {
			f.t.Fatal(err)
		}
		return a
	}
	f.t.Fatalf("no ask delivered: %v", msgs.Error())
	return mesh.Ask{}
}

func (f *fenceFarm) module(plan, m string) cascade.ModuleStatus {
	mods, _ := f.store.Modules(f.ctx, plan)
	return mods[m]
}

// waitBuilt waits until plan ends built.
func (f *fenceFarm) waitBuilt(plan string, within time.Duration) {
	f.t.Helper()
	testenv.WaitFor(f.t, within, "the plan built", func() bool {
		rec, err := f.store.Plan(f.ctx, plan)
		return err == nil && rec.Outcome == cascade.OutcomeBuilt
	})
}

// writeClaim writes rec as machine's own claim of rec.Ask, as js (the
// machine's own connection) may.
func (f *fenceFarm) writeClaim(js jetstream.JetStream, machine string, rec claim.AskRecord) {
	f.t.Helper()
	kv, err := js.KeyValue(f.ctx, mesh.AskClaimsBucket(mesh.BuildSeat))
	if err != nil {
		f.t.Fatal(err)
	}
	data, _ := json.Marshal(rec)
	if _, err := kv.Put(f.ctx, mesh.AskClaimKey(rec.Ask, machine), data); err != nil {
		f.t.Fatalf("%s writing its own claim of %s: %v", machine, rec.Ask, err)
	}
}

// announce publishes event v on machine's own subject, as js.
func (f *fenceFarm) announce(js jetstream.JetStream, machine, event string, v any, opts ...jetstream.PublishOpt) {
	f.t.Helper()
	data, _ := json.Marshal(v)
	if _, err := js.Publish(f.ctx, mesh.HolderEventSubject(mesh.BuildSeat, machine, event), data, opts...); err != nil {
		f.t.Fatal(err)
	}
}

// newMidFarm is a fence farm of base → mid → leaf whose machine m1 holds
// mid, building, until release is closed.
func newMidFarm(t *testing.T) (f *fenceFarm, plan string, mid mesh.Ask, release chan struct{}) {
	t.Helper()
	f = newFenceFarm(t, map[string][]string{"base": nil, "mid": {"base"}, "leaf": {"mid"}})
	release = make(chan struct{})
	w := &pushing{host: f.host, hold: map[string]chan struct{}{"mid": release}, began: make(chan mesh.Ask, 16)}
	f.agent("m1", w)
	plan = f.push("c1")
	for mid.Module != "mid" {
		select {
		case mid = <-w.began:
		case <-time.After(30 * time.Second):
			t.Fatal("mid never began on m1")
		}
	}
	testenv.WaitFor(t, 10*time.Second, "mid building on m1", func() bool {
		ms := f.module(plan, "mid")
		return ms.State == cascade.Building && ms.On == "m1"
	})
	return f, plan, mid, release
}

// pushing is a worker that pushes a small real image for every ask to the
// registry (so its digest resolves), holding the modules in hold until
// released, and reporting a digest never pushed for the modules in lie.
type pushing struct {
	host  string
	mu    sync.Mutex
	hold  map[string]chan struct{}
	lie   map[string]bool
	began chan mesh.Ask
}

func (p *pushing) Work(ctx context.Context, a mesh.Ask, _ func(string)) (agent.Result, error) {
	p.began <- a
	p.mu.Lock()
	gate := p.hold[a.Module]
	p.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return agent.Result{}, context.Cause(ctx)
		}
	}
	if p.lie[a.Module] {
		dg := "sha256:" + strings.Repeat("f", 64)
		return agent.Result{Digest: dg, Ref: a.Image + "@" + dg}, nil
	}
	return pushChaos(ctx, a)
}

// Attacks made with build machine m2's own credentials on a farm whose
// server enforces them, while m1 builds mid (issue 19): every one is
// refused by the server or by the controller, the genuine outcome arriving
// after a forgery is accepted, and the plan ends built with the genuine
// digests, none of it naming m2.
func TestAnotherMachinesForgeriesChangeNothing(t *testing.T) {
	f, plan, mid, release := newMidFarm(t)
	forged := "sha256:" + strings.Repeat("f", 64)
	built := func(on string) []byte {
		data, _ := json.Marshal(mesh.Built{Version: mesh.AskVersion, Ask: mid.ID, Plan: plan, Module: "mid", Digest: forged,
			Image: mid.Image + "@" + forged, On: on, Attempt: 1, At: time.Now().UTC()})
		return data
	}
	m2nc, m2 := f.connect(mesh.PrincipalID(mesh.KindAgent, "m2"))
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(f.ctx, 2*time.Second) }

	// 1. Speaking as m1: the server refuses the subject.
	ctx, cancel := short()
	_, err := m2.Publish(ctx, mesh.HolderEventSubject(mesh.BuildSeat, "m1", mesh.EventBuilt), built("m1"))
	cancel()
	if err == nil {
		t.Fatal("m2 published on m1's subject")
	}
	// 2. On its own subject, naming itself, with the genuine message id's
	// old spelling: the controller refuses it (m2 holds no claim of mid).
	if _, err := m2.Publish(f.ctx, mesh.HolderEventSubject(mesh.BuildSeat, "m2", mesh.EventBuilt), built("m2"),
		jetstream.WithMsgID(mid.ID+"-built-1")); err != nil {
		t.Fatal(err)
	}
	// 3. On its own subject, saying it is m1.
	if _, err := m2.Publish(f.ctx, mesh.HolderEventSubject(mesh.BuildSeat, "m2", mesh.EventBuilt), built("m1")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "both forgeries refused", func() bool {
		return f.refused.count(cascade.RefusedUnclaimed) >= 1 && f.refused.count(cascade.RefusedSpeaker) >= 1
	})
	if ms := f.module(plan, "mid"); ms.State != cascade.Building || ms.Digest != "" {
		t.Fatalf("after the forgeries mid is %s with digest %q, want still building", ms.State, ms.Digest)
	}
	// 4. Writing or deleting m1's claim of the ask, and m1's seat claim.
	akv, err := m2.KeyValue(f.ctx, mesh.AskClaimsBucket(mesh.BuildSeat))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = short()
	if _, err := akv.Put(ctx, mesh.AskClaimKey(mid.ID, "m1"), []byte(`{}`)); err == nil {
		t.Fatal("m2 wrote m1's claim of the ask")
	}
	if err := akv.Delete(ctx, mesh.AskClaimKey(mid.ID, "m1")); err == nil {
		t.Fatal("m2 deleted m1's claim of the ask")
	}
	ckv, err := m2.KeyValue(f.ctx, mesh.ClaimsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ckv.Put(ctx, mesh.ClaimKey(mesh.BuildSeat, "m1"), []byte(`{}`)); err == nil {
		t.Fatal("m2 wrote m1's seat claim")
	}
	cancel()
	// 5. Reading m1's deliveries: the server refuses the subscription.
	if _, err := m2nc.SubscribeSync(mesh.InboxPrefix(mesh.PrincipalID(mesh.KindAgent, "m1")) + ".>"); err != nil {
		t.Fatal(err)
	}
	_ = m2nc.Flush()
	testenv.WaitFor(t, 5*time.Second, "the server to refuse m2's subscription to m1's inbox", func() bool {
		for {
			select {
			case v := <-f.violations:
				if strings.Contains(v, "_INBOX_agent_m1") {
					return true
				}
			default:
				return false
			}
		}
	})
	if rec, ok, err := claim.ReadAsk(f.ctx, m2, akv, mid.ID, "m1"); err != nil || !ok || !rec.Held() {
		t.Fatalf("m1's claim of mid after the attacks: %+v %v %v", rec, ok, err)
	}

	// The genuine build lands, after the forgeries, and the plan ends built.
	close(release)
	f.waitBuilt(plan, 30*time.Second)
	for _, m := range []string{"base", "mid", "leaf"} {
		ms := f.module(plan, m)
		if ms.On != "m1" || ms.Digest == forged || ms.Digest == "" {
			t.Errorf("%s: on %q digest %q, want built on m1 with its genuine digest", m, ms.On, ms.Digest)
		}
		if _, err := registry.NewClient(registry.WithInsecure(true)).Resolve(f.ctx, f.host+"/"+m+"@"+ms.Digest); err != nil {
			t.Errorf("%s's digest does not resolve: %v", m, err)
		}
	}
	cur, err := f.store.Currents(f.ctx)
	if err != nil || cur["mid"].Digest != f.module(plan, "mid").Digest {
		t.Errorf("current mid %+v (%v), want the genuine digest", cur["mid"], err)
	}
}

// A built naming a digest the registry does not hold is refused even from
// the machine that holds the ask, and changes nothing.
func TestABuiltOfADigestNotInTheRegistryIsRefused(t *testing.T) {
	f := newFenceFarm(t, map[string][]string{"solo": nil})
	w := &pushing{host: f.host, lie: map[string]bool{"solo": true}, began: make(chan mesh.Ask, 16)}
	f.agent("m1", w)
	plan := f.push("c1")
	testenv.WaitFor(t, 30*time.Second, "the holder's built refused", func() bool {
		return f.refused.count(cascade.RefusedUnresolved) >= 1
	})
	ms := f.module(plan, "solo")
	if ms.State == cascade.Built || ms.Digest != "" {
		t.Fatalf("solo is %s with digest %q after a built the registry does not hold", ms.State, ms.Digest)
	}
	cur, err := f.store.Currents(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := cur["solo"]; ok {
		t.Fatalf("current solo is %+v", c)
	}
}

// flakyOnce fails a module's first attempt on infrastructure (the agent
// retries it after its retry delay), then works as pushing does.
type flakyOnce struct {
	*pushing
	mu    sync.Mutex
	tries map[string]int
}

func (f *flakyOnce) Work(ctx context.Context, a mesh.Ask, log func(string)) (agent.Result, error) {
	f.mu.Lock()
	f.tries[a.Module]++
	n := f.tries[a.Module]
	f.mu.Unlock()
	if n == 1 {
		return agent.Result{}, fmt.Errorf("%w: fetching %s: connection refused", agent.ErrInfra, meshtest.FleetRepo)
	}
	return f.pushing.Work(ctx, a, log)
}

// A retry is shown as such (issue 22): the holder's first attempt fails on
// infrastructure and it gives the ask back to be retried after a delay;
// its handed-back (after its claim is settled released) is applied as a
// note: `builds show` says "retrying (attempt 1: …; next in …)", the module
// queued on no machine, not building on m1. Its next start clears the
// note. A handed-back forged with m2's credentials — naming itself (no
// claim of the ask) or m1 (not its subject) — is refused and changes
// nothing; the plan ends built.
func TestAHandedBackIsShownAndForgeriesOfItAreRefused(t *testing.T) {
	f := newFenceFarm(t, map[string][]string{"solo": nil})
	release := make(chan struct{})
	w := &flakyOnce{pushing: &pushing{host: f.host, hold: map[string]chan struct{}{}, began: make(chan mesh.Ask, 16)}, tries: map[string]int{}}
	f.agent("m1", w)
	plan := f.push("c1")
	var noted cascade.ModuleStatus
	testenv.WaitFor(t, 30*time.Second, "solo's retry noted", func() bool {
		noted = f.module(plan, "solo")
		return noted.HandedBack != nil
	})
	h := noted.HandedBack
	if h.Attempt != 1 || h.Sick || h.On != "m1" || !strings.Contains(h.Why, "connection refused") || h.Next.IsZero() || h.InfraSince.IsZero() {
		t.Fatalf("handed back %+v: want attempt 1 on m1, not sick, why, next and the budget's start", h)
	}
	if noted.On != "" {
		t.Errorf("solo on %q after m1 gave it back, want no machine", noted.On)
	}
	if noted.State != cascade.Building && noted.State != cascade.Queued {
		// Its ask back in the queue with the note: `builds show` prints
		// it queued, retrying (planview's TestAHandedBackModuleSaysWhy
		// prints a module as it is here). Queued when the attempt failed
		// within the agent's StartedDelay (no started), else building.
		t.Errorf("solo %s after m1 gave it back, want queued or building with the note", noted.State)
	}

	// Its second attempt starts (held until released): the note is gone.
	w.mu.Lock()
	w.hold["solo"] = release
	w.mu.Unlock()
	var ask mesh.Ask
	select {
	case ask = <-w.began:
	case <-time.After(30 * time.Second):
		t.Fatal("solo's second attempt never began")
	}
	testenv.WaitFor(t, 10*time.Second, "solo building on m1 again", func() bool {
		ms := f.module(plan, "solo")
		return ms.State == cascade.Building && ms.On == "m1" && ms.HandedBack == nil
	})

	// Forgeries, with m2's credentials.
	_, m2 := f.connect(mesh.PrincipalID(mesh.KindAgent, "m2"))
	back := func(on string) []byte {
		data, _ := json.Marshal(mesh.HandedBack{Version: mesh.AskVersion, Ask: ask.ID, Plan: plan, Module: "solo", On: on, Attempt: 2,
			Why: "registry gone", Sick: true, At: time.Now().UTC()})
		return data
	}
	before := [2]int{f.refused.count(cascade.RefusedUnclaimed), f.refused.count(cascade.RefusedSpeaker)}
	for _, on := range []string{"m2", "m1"} {
		if _, err := m2.Publish(f.ctx, mesh.HolderEventSubject(mesh.BuildSeat, "m2", mesh.EventHandedBack), back(on)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "both forged hand-backs refused", func() bool {
		return f.refused.count(cascade.RefusedUnclaimed) > before[0] && f.refused.count(cascade.RefusedSpeaker) > before[1]
	})
	if ms := f.module(plan, "solo"); ms.State != cascade.Building || ms.On != "m1" || ms.HandedBack != nil {
		t.Fatalf("after the forgeries solo is %s on %q, handed back %+v: want building on m1, no note", ms.State, ms.On, ms.HandedBack)
	}
	close(release)
	f.waitBuilt(plan, 30*time.Second)
	if ms := f.module(plan, "solo"); ms.On != "m1" || ms.HandedBack != nil || ms.Attempt != 1 {
		t.Errorf("solo %+v: want built on m1, no note", ms)
	}
}

// A build machine may write its own claim of any ask, and publish on its
// own subject. Machine m2 does both while m1 builds mid, to take the ask
// over in flight: it claims mid's ask as m1's attempt and as a later one,
// and announces started, built — with an older image of mid's own that
// the registry holds, so the digest check passes — and failed. Each is
// refused while m1 holds its claim (RefusedHeld): mid stays building on
// m1, no machine is noted lost, and the plan ends built with m1's digest.
func TestAMachineThatClaimsAnAskAnotherBuildsCannotTakeItOver(t *testing.T) {
	f, plan, mid, release := newMidFarm(t)
	// An older image of mid, in mid's repository: a digest the registry
	// resolves.
	older := mid
	older.ID = "an-older-build-of-mid"
	old, err := pushChaos(f.ctx, older)
	if err != nil {
		t.Fatal(err)
	}

	_, m2 := f.connect(mesh.PrincipalID(mesh.KindAgent, "m2"))
	// m2 knows the ask's secret: the ask was delivered to it once (it
	// comes again to another machine while its holder builds it, and is
	// left to the holder), so its proofs are good.
	proof := mesh.AskProof(mid.Secret, mid.ID, "m2")
	if mid.Secret == "" || proof == "" {
		t.Fatal("the ask came with no secret")
	}
	publish := func(event string, v any) { f.announce(m2, "m2", event, v) }
	for _, attempt := range []int{1, 2} {
		now := time.Now().UTC()
		f.writeClaim(m2, "m2", claim.AskRecord{Ask: mid.ID, Machine: "m2", Holder: "m2", Attempt: attempt, Since: now, Renewed: now,
			Lease: "1m", Token: fmt.Sprintf("forged-%d", attempt)})
		publish(mesh.EventStarted, mesh.Started{Version: mesh.AskVersion, Ask: mid.ID, Plan: plan, Module: "mid", On: "m2", Attempt: attempt, At: now, Proof: proof})
		publish(mesh.EventBuilt, mesh.Built{Version: mesh.AskVersion, Ask: mid.ID, Plan: plan, Module: "mid", Digest: old.Digest,
			Image: mid.Image + "@" + old.Digest, On: "m2", Attempt: attempt, At: now, Proof: proof})
		if attempt == 2 {
			publish(mesh.EventFailed, mesh.Failed{Version: mesh.AskVersion, Ask: mid.ID, Plan: plan, Module: "mid", On: "m2", Attempt: attempt,
				Reason: "build", Message: "forged", At: now, Proof: proof})
		}
	}
	// Started and built of attempt 1 are refused for m1's hold; of attempt
	// 2, by then, for m1's hold or for m2's claim now recording attempt 2.
	testenv.WaitFor(t, 40*time.Second, "m2's outcomes refused", func() bool {
		return f.refused.count(cascade.RefusedHeld) >= 2 &&
			f.refused.count(cascade.RefusedHeld)+f.refused.count(cascade.RefusedAttempt) >= 5
	})
	ms := f.module(plan, "mid")
	if ms.State != cascade.Building || ms.On != "m1" || ms.Digest != "" || len(ms.Lost) > 0 {
		t.Fatalf("after m2's attempts mid is %s on %q, digest %q, lost %+v: want building on m1", ms.State, ms.On, ms.Digest, ms.Lost)
	}
	close(release)
	f.waitBuilt(plan, 30*time.Second)
	ms = f.module(plan, "mid")
	if ms.On != "m1" || ms.Digest == old.Digest || ms.Digest == "" || len(ms.Lost) > 0 {
		t.Errorf("mid built %+v: want built on m1 with its own digest, nobody lost", ms)
	}
	if cur, err := f.store.Currents(f.ctx); err != nil || cur["mid"].Digest != ms.Digest {
		t.Errorf("current mid %+v (%v), want m1's digest %s", cur["mid"], err, ms.Digest)
	}
}

// A machine that recorded its outcome in its claim and died before it
// announced it is adopted by the next machine given the ask (the agent's
// adopt: the same outcome, under the same message id, on its own
// subject): the controller, which saw the ask start on the first, takes
// the adopted built — and only with the digest the first recorded.
func TestAnOutcomeAdoptedFromAMachineThatDiedCountsWithItsOwnDigestOnly(t *testing.T) {
	f := newFenceFarm(t, map[string][]string{"solo": nil})
	plan := f.push("c1")
	id := cascade.AskID(plan, "solo", 1)
	testenv.WaitFor(t, 20*time.Second, "solo queued", func() bool { return f.module(plan, "solo").State == cascade.Queued })
	_, m1 := f.connect(mesh.PrincipalID(mesh.KindAgent, "m1"))
	_, m2 := f.connect(mesh.PrincipalID(mesh.KindAgent, "m2"))
	// The ask is delivered to m1 (its secret with it), and later to m2.
	ask := f.take(m1)
	if ask.ID != id || ask.Secret == "" {
		t.Fatalf("m1 was delivered %+v, want %s with its secret", ask, id)
	}
	image := ask.Image
	res, err := pushChaos(f.ctx, ask)
	if err != nil {
		t.Fatal(err)
	}
	other := ask
	other.ID = "another-build-of-solo"
	res2, err := pushChaos(f.ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	claimAs := func(js jetstream.JetStream, machine string, attempt int, settled *mesh.Built, msgID string) {
		t.Helper()
		now := time.Now().UTC()
		rec := claim.AskRecord{Ask: id, Machine: machine, Holder: machine, Attempt: attempt, Since: now, Renewed: now, Lease: "1m", Token: machine}
		if settled != nil {
			rec.Outcome, rec.MsgID = mesh.EventBuilt, msgID
			rec.Event, _ = json.Marshal(settled)
		}
		f.writeClaim(js, machine, rec)
	}
	publish := f.announce
	claimAs(m1, "m1", 1, nil, "")
	publish(m1, "m1", mesh.EventStarted, mesh.Started{Version: mesh.AskVersion, Ask: id, Plan: plan, Module: "solo", On: "m1", Attempt: 1,
		At: time.Now().UTC(), Proof: mesh.AskProof(ask.Secret, id, "m1")})
	testenv.WaitFor(t, 10*time.Second, "solo building on m1", func() bool {
		ms := f.module(plan, "solo")
		return ms.State == cascade.Building && ms.On == "m1"
	})
	// m1 records its built in its claim and dies before announcing it.
	built := mesh.Built{Version: mesh.AskVersion, Ask: id, Plan: plan, Module: "solo", Digest: res.Digest, Image: image + "@" + res.Digest,
		On: "m1", Attempt: 1, At: time.Now().UTC(), Proof: mesh.AskProof(ask.Secret, id, "m1")}
	const msgID = "solo-built-adopted"
	claimAs(m1, "m1", 1, &built, msgID)

	// m2 is given the ask. A built of another digest is refused: m1
	// settled the ask with its own.
	claimAs(m2, "m2", 2, nil, "")
	forged := built
	forged.On, forged.Attempt, forged.Digest, forged.Image = "m2", 2, res2.Digest, image+"@"+res2.Digest
	forged.Proof = mesh.AskProof(ask.Secret, id, "m2")
	publish(m2, "m2", mesh.EventBuilt, forged)
	testenv.WaitFor(t, 20*time.Second, "a built of another digest refused", func() bool { return f.refused.count(cascade.RefusedHeld) >= 1 })
	if ms := f.module(plan, "solo"); ms.State != cascade.Building || ms.Digest != "" {
		t.Fatalf("solo is %s with %q after a built of a digest m1 did not record", ms.State, ms.Digest)
	}
	// The adopted built, m1's own, counts.
	adopted := built
	adopted.On, adopted.Attempt = "m2", 2
	// m1's proof says nothing for m2: refused.
	publish(m2, "m2", mesh.EventBuilt, adopted)
	testenv.WaitFor(t, 20*time.Second, "a built with another machine's proof refused", func() bool { return f.refused.count(cascade.RefusedProof) >= 1 })
	adopted.Proof = mesh.AskProof(ask.Secret, id, "m2")
	publish(m2, "m2", mesh.EventBuilt, adopted, jetstream.WithMsgID(msgID))
	testenv.WaitFor(t, 20*time.Second, "solo built with m1's digest", func() bool {
		ms := f.module(plan, "solo")
		return ms.State == cascade.Built && ms.Digest == res.Digest
	})
}

// Ask ids are derived from the plan, so a machine can predict one before
// the ask is delivered to anybody. Machine m2 does, claims it under its
// own key and announces started and built — an older image of the module
// that the registry holds — with no proof and with a made-up one: the
// controller refuses them all (RefusedProof), the module stays queued,
// and the machine it is delivered to builds it.
func TestAMachineThatPredictsAnAsksIdCannotAnnounceIt(t *testing.T) {
	f := newFenceFarm(t, map[string][]string{"solo": nil})
	plan := f.push("c1")
	id := cascade.AskID(plan, "solo", 1)
	testenv.WaitFor(t, 20*time.Second, "solo queued", func() bool { return f.module(plan, "solo").State == cascade.Queued })
	image := f.host + "/solo"
	old, err := pushChaos(f.ctx, mesh.Ask{ID: "an-older-build-of-solo", Plan: plan, Module: "solo", Image: image})
	if err != nil {
		t.Fatal(err)
	}
	_, m2 := f.connect(mesh.PrincipalID(mesh.KindAgent, "m2"))
	now := time.Now().UTC()
	f.writeClaim(m2, "m2", claim.AskRecord{Ask: id, Machine: "m2", Holder: "m2", Attempt: 1, Since: now, Renewed: now, Lease: "1m", Token: "forged"})
	for _, proof := range []string{"", mesh.AskProof("a guess", id, "m2")} {
		for event, v := range map[string]any{
			mesh.EventStarted: mesh.Started{Version: mesh.AskVersion, Ask: id, Plan: plan, Module: "solo", On: "m2", Attempt: 1, At: now, Proof: proof},
			mesh.EventBuilt: mesh.Built{Version: mesh.AskVersion, Ask: id, Plan: plan, Module: "solo", Digest: old.Digest, Image: image + "@" + old.Digest,
				On: "m2", Attempt: 1, At: now, Proof: proof},
		} {
			f.announce(m2, "m2", event, v)
		}
	}
	testenv.WaitFor(t, 20*time.Second, "m2's announcements refused", func() bool { return f.refused.count(cascade.RefusedProof) >= 4 })
	if ms := f.module(plan, "solo"); ms.State != cascade.Queued || ms.On != "" || ms.Digest != "" {
		t.Fatalf("after m2's announcements solo is %s on %q with %q, want queued", ms.State, ms.On, ms.Digest)
	}
	w := &pushing{host: f.host, began: make(chan mesh.Ask, 16)}
	f.agent("m1", w)
	f.waitBuilt(plan, 30*time.Second)
	if ms := f.module(plan, "solo"); ms.On != "m1" || ms.Digest == old.Digest || ms.Digest == "" {
		t.Errorf("solo %+v: want built on m1 with its own digest", ms)
	}
}

// Every holder answers the build seat's status tool, so every machine
// hears its requests. Machine m2, with its own credentials, answers each
// for m1 (unhealthy, with a build in flight) and for a machine that does
// not exist: on its own subject (dropped: the subject names m2), on m1's
// (refused by the server) and on the requester's inbox (nobody listens
// there). `builds machines` (agent.AskStatus, as the operator) shows m1 as
// m1 says, and no ghost.
func TestAMachineCannotAnswerTheStatusToolForAnother(t *testing.T) {
	f := newFenceFarm(t, map[string][]string{"solo": nil})
	f.agent("m1", &pushing{host: f.host, began: make(chan mesh.Ask, 16)})
	m2nc, _ := f.connect(mesh.PrincipalID(mesh.KindAgent, "m2"))
	lies := func(nonce string) [][]byte {
		var out [][]byte
		for _, machine := range []string{"m1", "ghost"} {
			st := agent.Status{Machine: machine, Slots: 9, InFlight: 9, Health: agent.HealthUnhealthy, Why: "forged", Platforms: []string{mesh.DefaultPlatform}}
			data, _ := json.Marshal(map[string]any{"nonce": nonce, "status": st})
			out = append(out, data)
		}
		return out
	}
	var answered sync.WaitGroup
	answered.Add(1)
	var once sync.Once
	if _, err := m2nc.Subscribe(mesh.SeatToolSubject(mesh.BuildSeat, mesh.StatusTool), func(m *nats.Msg) {
		var req struct {
			Nonce string `json:"nonce"`
		}
		_ = json.Unmarshal(m.Data, &req)
		for _, lie := range lies(req.Nonce) {
			_ = m2nc.Publish(mesh.HolderStatusSubject(mesh.BuildSeat, "m2"), lie)
			_ = m2nc.Publish(mesh.HolderStatusSubject(mesh.BuildSeat, "m1"), lie)
			if m.Reply != "" {
				_ = m2nc.Publish(m.Reply, lie)
			}
		}
		_ = m2nc.Flush()
		once.Do(answered.Done)
	}); err != nil {
		t.Fatal(err)
	}
	_ = m2nc.Flush()
	onc, _ := f.connect(mesh.OperatorPrincipal)
	var got []agent.Status
	testenv.WaitFor(t, 20*time.Second, "m1 to answer", func() bool {
		var err error
		got, err = agent.AskStatus(f.ctx, onc, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return len(got) > 0
	})
	answered.Wait()
	if len(got) != 1 || got[0].Machine != "m1" || got[0].Health != agent.HealthHealthy || got[0].Slots != 1 || got[0].Why != "" {
		t.Fatalf("the status tool answered %+v: want m1 alone, healthy, one slot, as it says", got)
	}
	testenv.WaitFor(t, 5*time.Second, "the server to refuse m2's answer on m1's subject", func() bool {
		for {
			select {
			case v := <-f.violations:
				if strings.Contains(v, mesh.HolderStatusSubject(mesh.BuildSeat, "m1")) {
					return true
				}
			default:
				return false
			}
		}
	})
}

// A claim of an ask by a machine that was never delivered it does not keep
// the ask from the machines it is delivered to. m2 claims solo's ask
// (predicted from the plan) under its own key, held for an hour, as soon
// as the plan is made; m1's first attempt fails on infrastructure and the
// ask comes back to it: it looks at every claim before it builds again,
// passes m2's over (no proof of delivery), and builds it.
func TestAClaimWithoutAProofOfDeliveryKeepsNoAskFromItsHolders(t *testing.T) {
	f := newFenceFarm(t, map[string][]string{"solo": nil})
	plan := f.push("c1")
	id := cascade.AskID(plan, "solo", 1)
	_, m2 := f.connect(mesh.PrincipalID(mesh.KindAgent, "m2"))
	now := time.Now().UTC()
	f.writeClaim(m2, "m2", claim.AskRecord{Ask: id, Machine: "m2", Holder: "m2", Attempt: 1, Since: now, Renewed: now, Lease: "1h", Token: "forged"})
	w := &flakyOnce{pushing: &pushing{host: f.host, began: make(chan mesh.Ask, 16)}, tries: map[string]int{}}
	f.agent("m1", w)
	f.waitBuilt(plan, 40*time.Second)
	if ms := f.module(plan, "solo"); ms.On != "m1" || ms.Attempt != 1 {
		t.Errorf("solo %+v: want built on m1", ms)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tries["solo"] != 2 {
		t.Errorf("solo was worked %d times, want 2 (the infrastructure failure, then the build)", w.tries["solo"])
	}
}
