package daemon

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/state"
)

// stateProbe bounds how long an agent on its own waits to learn whether it
// reaches its bucket.
const stateProbe = 5 * time.Second

// agentState is the state surface the build agent keeps its build records
// through (ADR 0201): the node runtime's, when the runtime carries the agent
// (it is in ctx, issued with the assignment); for an agent on its own, its
// bucket reached on its own connection, when its credentials reach it and
// the catalogue declares it. Otherwise it is nil, and the agent runs without
// keeping records, said once in the log.
func agentState(ctx context.Context, js jetstream.JetStream, machine string, log *slog.Logger) agent.StateWriter {
	if st, ok := state.FromContext(ctx); ok {
		if is, ok := st.(interface{ Issued() []mesh.IssuedBucket }); ok &&
			!slices.ContainsFunc(is.Issued(), func(b mesh.IssuedBucket) bool { return b.Name == mesh.AgentBuildsBucket && b.Write }) {
			log.Warn("running without keeping build records: the node did not issue the agent its bucket (declare `state: [{name: builds}]` in build-agent's manifest)",
				"bucket", mesh.AgentBuildsBucket)
			return nil
		}
		return st
	}
	bucket := mesh.KVBucket(mesh.AgentModule, mesh.AgentBuildsBucket)
	st := state.New(js, mesh.AgentModule, []mesh.IssuedBucket{{Name: mesh.AgentBuildsBucket, Bucket: bucket, Write: true}})
	pctx, cancel := context.WithTimeout(ctx, stateProbe)
	defer cancel()
	_, err := st.Get(pctx, mesh.AgentBuildsBucket, mesh.BuildRecordKey(mesh.AgentModule, machine))
	if err == nil || errors.Is(err, state.ErrNotFound) {
		return st
	}
	if ctx.Err() == nil {
		log.Warn("running without keeping build records: the agent's bucket cannot be reached (declare `state: [{name: builds}]` in build-agent's manifest, or issue the agent credentials from a catalogue that does)",
			"bucket", bucket, "err", err)
	}
	return nil
}
