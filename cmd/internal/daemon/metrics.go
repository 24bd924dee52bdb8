package daemon

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cascade"
	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/metrics"
)

// ServeMetrics serves reg's metrics on http://addr/metrics until ctx ends
// and returns the address it listens on (":0" picks a port). An empty addr
// serves nothing and returns "".
func ServeMetrics(ctx context.Context, addr string, reg *prometheus.Registry, log *slog.Logger) (string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a, err := metrics.Serve(ctx, addr, reg)
	if err != nil || a == nil {
		return "", err
	}
	log.Info("serving metrics", "url", "http://"+a.String()+"/metrics")
	return a.String(), nil
}

// processRegistry is a registry with the Go runtime's and the process's
// own collectors, for a process that serves /metrics.
func processRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// AgentMetrics serves a build agent process's metrics on addr until ctx
// ends and returns the agent's observer; an empty addr serves none and
// returns a nil observer.
func AgentMetrics(ctx context.Context, addr, machine string, log *slog.Logger) (agent.Observer, error) {
	if addr == "" {
		return nil, nil
	}
	reg := processRegistry()
	obs := metrics.NewAgent(reg, machine)
	if _, err := ServeMetrics(ctx, addr, reg, log); err != nil {
		return nil, err
	}
	return obs, nil
}

// NodeMetrics serves a mesh-node process's metrics on addr until ctx ends:
// the node's own (revision lag, applies) and those of the build agent it
// carries. It returns both observers; an empty addr serves none and returns
// nil observers.
func NodeMetrics(ctx context.Context, addr, node string, log *slog.Logger) (agent.Observer, deploy.Observer, error) {
	if addr == "" {
		return nil, nil, nil
	}
	reg := processRegistry()
	aobs := metrics.NewAgent(reg, node)
	nobs := deploy.NewMetrics(reg, node)
	if _, err := ServeMetrics(ctx, addr, reg, log); err != nil {
		return nil, nil, err
	}
	return aobs, nobs, nil
}

// controllerObserver is the controller process's observer: its plans
// (cascade.Observer) and its fleet (deploy.Observer, which RunController
// finds in ControllerOptions.Observer).
type controllerObserver struct {
	*metrics.Controller
	*deploy.Metrics
}

// ControllerMetrics serves the controller process's metrics on addr until
// ctx ends — its plans, its fleet of nodes, and the build seat's work queue
// read on every scrape over a connection of its own — and returns the
// controller's observer (a deploy.Observer too); an empty addr serves none
// and returns a nil observer.
func ControllerMetrics(ctx context.Context, addr, natsURL, creds string, log *slog.Logger, opts ...nats.Option) (cascade.Observer, error) {
	if addr == "" {
		return nil, nil
	}
	nc, js, err := Connect(natsURL, creds, mesh.ControllerPrincipal, "build-controller metrics", opts...)
	if err != nil {
		return nil, err
	}
	reg := processRegistry()
	obs := controllerObserver{metrics.NewController(reg), deploy.NewMetrics(reg, "")}
	reg.MustRegister(metrics.NewQueueCollector(js, []string{mesh.BuildSeat}))
	if _, err := ServeMetrics(ctx, addr, reg, log); err != nil {
		nc.Close()
		return nil, err
	}
	context.AfterFunc(ctx, nc.Close)
	return obs, nil
}
