package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
)

// What the agent keeps per machine (ADR 0201): after each build it settles
// — built or failed — it writes the machine's record of the module
// (mesh.BuildRecord) in its own state, bucket mesh.AgentBuildsBucket, under
// mesh.BuildRecordKey(module, machine), through the state surface the node
// runtime issued it (Config.State). One value per key: the last build of the
// module on this machine. The controller reads them (reads:
// build-agent.builds), and so does `builds state get build-agent.builds
// MODULE.MACHINE`.

// StateWriter is the part of a module's state surface the agent writes its
// records through; state.Surface (a state.Store in process, a state.Client
// out of process) has it.
type StateWriter interface {
	Put(ctx context.Context, bucket, key string, value []byte) (uint64, error)
}

// keepTimeout bounds writing one record: a record that cannot be written is
// logged and the agent goes on.
const keepTimeout = 5 * time.Second

// record is the machine's record of ask's build, ended with outcome
// (mesh.EventBuilt or mesh.EventFailed) after took.
func (a *Agent) record(ask mesh.Ask, outcome string, took time.Duration, at time.Time) *mesh.BuildRecord {
	return &mesh.BuildRecord{Version: mesh.BuildRecordVersion, Module: ask.Module, Machine: a.cfg.Machine,
		Platform: ask.Platform, Outcome: outcome, Duration: took, At: at, Plan: ask.Plan, Ask: ask.ID}
}

// keep writes r through the agent's state surface, when it has one. It
// carries on when ctx is cancelled (a stopping agent still keeps what it
// did), within keepTimeout; a failure is logged, never the ask's.
func (a *Agent) keep(ctx context.Context, log *slog.Logger, r *mesh.BuildRecord) {
	if a.cfg.State == nil || r == nil {
		return
	}
	data, err := json.Marshal(r)
	if err != nil {
		log.Warn("encoding the build record", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keepTimeout)
	defer cancel()
	key := mesh.BuildRecordKey(r.Module, r.Machine)
	if _, err := a.cfg.State.Put(ctx, mesh.AgentBuildsBucket, key, data); err != nil {
		log.Warn("keeping the build record in the agent's state", "bucket", mesh.AgentBuildsBucket, "key", key, "err", err)
	}
}
