package mesh

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"
)

// The principals a credential speaks for. Each one's permission set is
// derived by one of this package's functions; PrincipalPermissions picks it.
const (
	// ControllerPrincipal is the controller's principal: its inbox prefix
	// and its set (ControllerPermissions).
	ControllerPrincipal = "controller"
	// OperatorPrincipal is an operator's `builds` CLI (OperatorPermissions).
	OperatorPrincipal = "operator"
	// AgentModule is the module a build agent runs as (its set is that
	// module's, ModulePermissions).
	AgentModule = "build-agent"
)

// The kinds of principal PrincipalPermissions knows.
const (
	KindController = "controller"
	KindOperator   = "operator"
	KindAgent      = "agent"
	KindNode       = "node"
	KindModule     = "module"
)

// PrincipalKinds lists the kinds, for help texts and errors.
var PrincipalKinds = []string{KindController, KindOperator, KindAgent, KindNode, KindModule}

// PrincipalID is the one name of the principal of kind kind called name:
// "controller" and "operator" for the two that are one of a kind, else
// "<kind>_<name>" ("agent_m1", "node_m1", "module_scanner"). Local names
// never hold '_', so no two principals share an id, and none can take
// another's inbox (InboxPrefix) by the name it is issued with.
func PrincipalID(kind, name string) string {
	switch kind {
	case KindController, KindOperator:
		return kind
	}
	return kind + "_" + name
}

// ReservedMachineNames are names no machine (agent or node) may be issued
// or enrol under: the principals that are one of a kind, the kinds, and the
// mesh's own prefix.
var ReservedMachineNames = []string{ControllerPrincipal, OperatorPrincipal, KindAgent, KindNode, KindModule, AgentModule, Root, "all", "any"}

// ValidMachineName refuses a name that cannot name a build machine of kind
// (agent or node): one that is not a subject token and durable name
// (ValidNodeName), or that is reserved (ReservedMachineNames, or starting
// "mesh-").
func ValidMachineName(kind, name string) error {
	if err := ValidNodeName(name); err != nil {
		return err
	}
	if slices.Contains(ReservedMachineNames, name) || strings.HasPrefix(name, Root+"-") {
		return fmt.Errorf("%s name %q is reserved (it names another principal, or the mesh's own): choose the machine's host name, such as build-1", kind, name)
	}
	return nil
}

// PrincipalPermissions returns the derived set of the principal of kind
// kind: the controller, an operator, the build agent on machine name, node name (carrying
// NodeCarries: NodePrincipalPermissions) or module name (name is required
// for agent, node and module). It derives nothing
// itself: it calls the one derivation of that principal.
func (c *Catalogue) PrincipalPermissions(kind, name string) (Permissions, error) {
	switch kind {
	case KindController:
		return c.ControllerPermissions(ControllerPrincipal), nil
	case KindOperator:
		return c.OperatorPermissions(OperatorPrincipal), nil
	case KindAgent:
		if name == "" {
			return Permissions{}, fmt.Errorf("agent principal without a name: every build machine has credentials of its own; name the machine (e.g. agent build-1)")
		}
		return c.MachinePermissions(name)
	case KindNode:
		// What every build machine's node carries, of what the catalogue
		// has: a catalogue without a build agent issues none.
		var carries []string
		for _, m := range NodeCarries {
			if _, ok := c.Module(m); ok {
				carries = append(carries, m)
			}
		}
		return c.NodePrincipalPermissions(name, carries)
	case KindModule:
		if name == "" {
			return Permissions{}, fmt.Errorf("module principal without a name: name the module (e.g. module %s)", AgentModule)
		}
		m, ok := c.Module(name)
		if !ok {
			return Permissions{}, fmt.Errorf("the catalogue has no module %q: see `builds catalogue show`", name)
		}
		return c.ModulePermissions(m), nil
	}
	return Permissions{}, fmt.Errorf("unknown principal %q: want one of %v", kind, PrincipalKinds)
}

// NodeCarries are the modules a node's credentials let it carry unless
// they name others: the build agent, which the runtime runs in-process on
// every build machine.
var NodeCarries = []string{AgentModule}

// NodePrincipalPermissions is the derived set of node name's credentials
// when it may carry the modules carries: its own set and the buckets those
// modules are issued (NodeStatePermissions): write where one of them owns
// a bucket, read where one reads it, nothing on any other bucket. Every
// module carries names must be in the catalogue.
func (c *Catalogue) NodePrincipalPermissions(name string, carries []string) (Permissions, error) {
	if err := ValidMachineName(KindNode, name); err != nil {
		return Permissions{}, err
	}
	for _, m := range carries {
		if _, ok := c.Module(m); !ok {
			return Permissions{}, fmt.Errorf("node %s carries %q, which the catalogue has no module of: name modules from `builds catalogue show`", name, m)
		}
	}
	return c.NodeStatePermissions(name, carries), nil
}

// JWTPermissions turns a derived set into a decentralized user JWT's form,
// the same allow lists ServerPermissions gives the server's user
// configuration. An empty list denies everything: to the server an empty
// allow list would mean no restriction at all.
func (p Permissions) JWTPermissions() jwt.Permissions {
	jp := jwt.Permissions{Pub: jwtAllow(p.Publish), Sub: jwtAllow(p.Subscribe)}
	if p.Responses {
		jp.Resp = &jwt.ResponsePermission{MaxMsgs: 1}
	}
	return jp
}

func jwtAllow(subjects []string) jwt.Permission {
	if len(subjects) == 0 {
		return jwt.Permission{Deny: jwt.StringList{">"}}
	}
	return jwt.Permission{Allow: jwt.StringList(AllowList(subjects))}
}
