package main

import (
	"context"

	"github.com/meshbuild/meshbuild/agent"
	"github.com/meshbuild/meshbuild/cmd/internal/daemon"
	"github.com/meshbuild/meshbuild/deploy"
)

// buildAgent is the one place the node runtime reaches the build agent: the
// module it carries in-process, run with the node's BuildKit and workspace
// settings. Cancelling its context stops it, handing back the asks it holds.
func buildAgent(o daemon.AgentOptions) deploy.RunFunc {
	return func(ctx context.Context) error { return daemon.RunAgent(ctx, o) }
}

// agentConfig is the agent's config for this node.
func agentConfig(machine string, platforms []string, slots int) agent.Config {
	cfg := agent.DefaultConfig()
	cfg.Machine, cfg.Platforms, cfg.Slots = machine, platforms, slots
	return cfg
}
