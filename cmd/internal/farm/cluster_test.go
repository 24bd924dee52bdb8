package farm_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/cmd/internal/demo"
	"github.com/meshbuild/meshbuild/cmd/internal/farm"
	"github.com/meshbuild/meshbuild/cmd/internal/farm/farmtest"
	"github.com/meshbuild/meshbuild/internal/testenv"
	"github.com/meshbuild/meshbuild/mesh"
)

// TestUpCluster: `builds up --cluster 3` runs three NATS servers joined by
// routes; the banner lists every URL, the controller raises every stream
// and bucket at three replicas spread over the three, the demo's plan is
// built on it, and Stop lets go of every server's port.
func TestUpCluster(t *testing.T) {
	testenv.RequireBuildkit(t)
	catalogue, src := testenv.SmallFleet(t, "base", "runtime")
	state := t.TempDir()
	var banner bytes.Buffer
	f, _, stop := farmtest.Up(t, farm.UpOptions{
		Catalogue: catalogue, Agents: 1, StateDir: state, Cluster: 3,
		InsteadOf: demo.InsteadOf(state), Out: &banner,
	})
	defer stop()
	urls := strings.Split(f.NATSURL(), ",")
	if len(urls) != 3 {
		t.Fatalf("NATSURL = %s, want three URLs", f.NATSURL())
	}
	if want := f.NATSURL() + " (JetStream cluster of 3, streams and buckets R3; authorization on"; !strings.Contains(banner.String(), want) {
		t.Errorf("the banner lacks %q:\n%s", want, banner.String())
	}

	// As the controller (it raises them): the cluster, like the single server, admits only
	// the credentials the farm issued.
	nc, js, err := daemon.Connect(f.NATSURL(), f.ControllerCreds(), mesh.ControllerPrincipal, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, name := range []string{mesh.EventsStream, mesh.SeatStream(mesh.BuildSeat), mesh.KVStream(mesh.KVBucket("build-controller", cascade.StateBucket))} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Errorf("stream %s: %v", name, err)
			continue
		}
		info := st.CachedInfo()
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Errorf("stream %s: %d replicas, cluster %+v; want 3, a leader and two replicas", name, info.Config.Replicas, info.Cluster)
		}
	}

	var out bytes.Buffer
	if err := demo.Run(ctx, f, src, &out); err != nil {
		t.Fatalf("demo.Run on the cluster: %v\n%s", err, out.String())
	}

	if err := f.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	for _, u := range urls {
		addr := strings.TrimPrefix(u, "nats://")
		if l, err := net.Listen("tcp", addr); err != nil {
			t.Errorf("%s is still held after Stop: %v", addr, err)
		} else {
			l.Close()
		}
	}
}
