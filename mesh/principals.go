package mesh

import (
	"fmt"

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

// PrincipalPermissions returns the derived set of the principal of kind
// kind: the controller, an operator, the build agent, node name or module
// name (name is required for node and module only). It derives nothing
// itself: it calls the one derivation of that principal.
func (c *Catalogue) PrincipalPermissions(kind, name string) (Permissions, error) {
	switch kind {
	case KindController:
		return c.ControllerPermissions(ControllerPrincipal), nil
	case KindOperator:
		return c.OperatorPermissions(OperatorPrincipal), nil
	case KindAgent:
		m, ok := c.Module(AgentModule)
		if !ok {
			return Permissions{}, fmt.Errorf("the catalogue has no module %s: the agent's permissions are that module's", AgentModule)
		}
		return c.ModulePermissions(m), nil
	case KindNode:
		if err := ValidNodeName(name); err != nil {
			return Permissions{}, err
		}
		return NodePermissions(name), nil
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
	return jwt.Permission{Allow: append(jwt.StringList(nil), subjects...)}
}
