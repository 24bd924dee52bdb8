// Package metrics is meshbuild's Prometheus instrumentation and its Grafana
// dashboards.
//
// Every process serves its own /metrics (Serve; the mains take --metrics
// ADDR): each build agent, each node, and the controller. Metrics are registered on a
// registry the caller provides — the package keeps no global state — and
// carry only bounded labels: machine, node, outcome, reason, state, seat. A module
// or an ask is never a label; `builds plans` and `builds explain` answer
// per-module questions.
//
// # Build agents
//
// NewAgent returns the agent.Observer of one machine. Its series carry the
// machine as a constant label, so the agents of several machines (`builds
// up`) may share one registry. The common outcome and reason combinations
// exist at zero from the start, so a rate over them is defined before the
// first build.
//
//	meshbuild_agent_builds_total{machine,outcome,reason}           counter
//	    Asks finished. outcome: built, failed (settled, reported once),
//	    retried (an infrastructure failure given back to be tried again),
//	    handed-back (the agent stopped mid-build). reason, for failed and
//	    retried: source, build, push, infra, ask, cancelled (mesh.Reason*);
//	    empty otherwise.
//	meshbuild_agent_build_duration_seconds{machine,outcome}        histogram
//	    Time spent on an ask: checkout, build, push (0.5s to 1h buckets).
//	meshbuild_agent_asks_in_flight{machine}                        gauge
//	    Asks being worked now: at most the agent's slots.
//	meshbuild_agent_idle_wait_seconds{machine}                     histogram
//	    How long an idle slot waited for the ask it then got.
//	meshbuild_agent_pushed_bytes_total{machine}                    counter
//	    Image bytes pushed to the registry.
//	meshbuild_agent_cache_hits_total{machine}                      counter
//	    Build steps found in the build cache.
//
// # Controller
//
// NewController returns the cascade.Observer of the controller.
//
//	meshbuild_controller_plans{state}                              gauge
//	    Plans held: running (modules still to build), failed (kept for a
//	    retry). Updated every few seconds.
//	meshbuild_controller_plans_settled_total{outcome}              counter
//	    Plans settled: built, failed, cancelled.
//	meshbuild_controller_plan_duration_seconds{outcome}            histogram
//	    From the trigger to settled (1s to 4h buckets).
//	meshbuild_controller_modules_blocked                           gauge
//	    Modules of the plans held that wait on a failed base.
//	meshbuild_controller_ready_to_started_seconds{priority,owner}  histogram
//	    How long a module waited from ready (every base built) to started
//	    on a machine, by its plan's priority and owner: what the scheduler
//	    makes each wait (10ms to 1h buckets).
//
// # Nodes
//
// Package deploy's NewMetrics registers these (its tests and this
// package's check them against the dashboards). Each node (mesh-node, and
// the machines of `builds up`) serves its own beside the build agent it
// carries, the node as a constant label; the lag is set on every
// declaration the node sees and after every outcome:
//
//	meshbuild_node_revision_lag{node}                              gauge
//	    The newest revision the node was declared less the one it applied:
//	    0 once it runs what it was given; stays above 0 while applying fails.
//	meshbuild_node_applies_total{node,outcome}                     counter
//	    Declarations settled: applied, failed (retried after a delay),
//	    refused (at or below the revision applied).
//	meshbuild_node_apply_seconds{node,outcome}                     histogram
//	    Pull, verify and apply hook (0.05s to 7min buckets).
//
// The controller serves its view of every node, from the nodes' reports and
// heartbeats — what `builds nodes` shows, to alert on:
//
//	meshbuild_controller_node_declared_revision{node}              gauge
//	meshbuild_controller_node_applied_revision{node}               gauge
//	    The revision declared to the node, and the one it last said it
//	    applied; apart for long, the node is behind or silent.
//	meshbuild_controller_node_heard_timestamp_seconds{node}        gauge
//	    When the node was last heard from (Unix time); `builds nodes` shows
//	    it offline after 90s.
//	meshbuild_node_reports_total{kind,how}                         counter
//	    Reports and heartbeats settled by the store window: recorded,
//	    heard, superseded, held, let-go (held past the bound: lost).
//
// For example, alert on `max by (node) (meshbuild_node_revision_lag) > 0`
// for 15m, on `time() - max by (node)
// (meshbuild_controller_node_heard_timestamp_seconds) > 90`, and on any
// increase of meshbuild_node_reports_total{how="let-go"}.
//
// # Work queues
//
// NewQueueCollector reads, on every scrape and within QueueScrapeTimeout,
// each seat's work-queue stream and its holders' consumer (names from
// mesh.SeatStream and mesh.SeatConsumer). The controller's process
// registers it for the build seat.
//
//	meshbuild_queue_depth{seat}                                    gauge
//	    Asks waiting, not yet delivered to a holder (the consumer's pending).
//	meshbuild_queue_in_flight{seat}                                gauge
//	    Asks delivered and not yet settled (the consumer's ack pending).
//	meshbuild_queue_oldest_ask_age_seconds{seat}                   gauge
//	    Age of the oldest ask not yet delivered; 0 when none waits.
//	meshbuild_queue_up{seat}                                       gauge
//	    1 if the queue could be read at this scrape; 0 if not, and then the
//	    seat's other queue series are missing from the scrape.
//
// # Scraping
//
// Point Prometheus at every process, e.g.
//
//	scrape_configs:
//	  - job_name: meshbuild
//	    static_configs:
//	      - targets: ["controller:9465", "build-1:9464", "build-2:9464"]
//
// # Dashboards
//
// dashboards/ holds two Grafana dashboards (Grafana 10 and later):
// meshbuild-farm.json (work waiting, plans in progress, throughput, failures
// by reason, the queue, the controller) and meshbuild-machines.json (per
// machine: builds, duration p50/p95, asks in flight, idle wait, pushed
// bytes, cache hits; and a Nodes row: revision lag, declared and applied
// revision, apply duration p50/p95 and outcomes, nodes online, last heard,
// reports). Both choose their Prometheus through a `datasource`
// variable. To use them, either
//
//   - in Grafana, Dashboards → New → Import, upload the JSON file and pick
//     the Prometheus data source; or
//   - provision them: copy provisioning/dashboards.yaml to Grafana's
//     provisioning/dashboards/ directory and the JSON files to the path it
//     names (/var/lib/grafana/dashboards/meshbuild), and, if Grafana has no
//     Prometheus data source yet, provisioning/datasource.yaml (edit its url)
//     to provisioning/datasources/.
//
// The JSON is generated by generate_test.go: edit the definitions there and
// run
//
//	go test ./metrics -run TestDashboardsAreGenerated -update
//
// DashboardQueries returns every panel's PromQL; the package's tests check
// each one against the metrics the package exports, and (with
// MESHBUILD_PROMETHEUS=1 or MESHBUILD_BUILDKIT=1, as make test sets) against
// a real Prometheus scraping a real in-process farm; with
// MESHBUILD_BUILDKIT=1, cmd/internal/demo's tests check them again against the
// farm `builds up` starts, after its demo plan.
package metrics
