package farm

import (
	"fmt"
	"path/filepath"

	"github.com/meshbuild/meshbuild/cmd/internal/creds"
	"github.com/meshbuild/meshbuild/mesh"
)

// CredsDir is where a farm keeps its NATS keys (creds.Keys) and the
// credentials it issued, in its state directory.
func CredsDir(stateDir string) string { return filepath.Join(stateDir, "creds") }

// OperatorCredsIn is the operator's credentials file in a farm's state
// directory: `builds` finds it there through MESHBUILD_STATE.
func OperatorCredsIn(stateDir string) string { return credsFile(stateDir, mesh.KindOperator, "") }

// credsFile is the credentials file of a principal in a farm's state
// directory: operator.creds, controller.creds, node-NAME.creds,
// agent-NAME.creds (the agent of machine NAME).
func credsFile(stateDir, kind, name string) string {
	file := kind
	if name != "" {
		file += "-" + name
	}
	return filepath.Join(CredsDir(stateDir), file+".creds")
}

// OperatorCreds is the operator's credentials file: what `builds` (and the
// demo's announcement of a push) connect with.
func (f *Farm) OperatorCreds() string { return credsFile(f.stateDir, mesh.KindOperator, "") }

// ControllerCreds is the controller's credentials file.
func (f *Farm) ControllerCreds() string { return credsFile(f.stateDir, mesh.KindController, "") }

// NodeCreds is the credentials file of the node on machine m.
func (f *Farm) NodeCreds(m string) string { return credsFile(f.stateDir, mesh.KindNode, m) }

// AgentCreds is the credentials file of the build agent on machine m.
func (f *Farm) AgentCreds(m string) string { return credsFile(f.stateDir, mesh.KindAgent, m) }

// issueCreds opens the farm's keys (making them on its first start) and
// issues every component its own credentials from the catalogue's derived
// sets: the controller, the operator, and each machine's node and agent.
// They are issued again on every start, so a changed catalogue's sets are
// the ones in force.
func (f *Farm) issueCreds(cat *mesh.Catalogue) (*creds.Keys, error) {
	keys, err := creds.Ensure(CredsDir(f.stateDir))
	if err != nil {
		return nil, err
	}
	type principal struct{ kind, name, label, file string }
	ps := []principal{
		{mesh.KindController, "", "controller", f.ControllerCreds()},
		{mesh.KindOperator, "", "operator", f.OperatorCreds()},
	}
	for _, m := range f.machines {
		ps = append(ps,
			principal{mesh.KindNode, m, "mesh-node " + m, f.NodeCreds(m)},
			principal{mesh.KindAgent, m, "build-agent " + m, f.AgentCreds(m)})
	}
	for _, p := range ps {
		perms, err := cat.PrincipalPermissions(p.kind, p.name)
		if err != nil {
			return nil, fmt.Errorf("credentials of %s: %w", p.label, err)
		}
		if err := keys.IssueFile(perms, p.label, p.file); err != nil {
			return nil, err
		}
	}
	return keys, nil
}
