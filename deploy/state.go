package deploy

import (
	"context"
	"os"

	"github.com/meshbuild/meshbuild/state"
)

// Module state (ADR 0201): the runtime serves each module the buckets its
// declaration issues it, through one state.Store per module over the node's
// connection. A module carried in-process finds its store in its context; a
// module out of process reaches it on its own unix socket under the state
// directory (state.SocketPath), in a directory only the node's user may
// enter, named to the module by the apply hook's MESHBUILD_STATE_SOCKET.

// issue returns module m's state surface, made or reissued from what its
// declaration issues it.
func (n *Node) issue(m DeclaredModule) *state.Store {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.states[m.Module]
	if !ok {
		st = state.New(n.js, m.Module, m.Buckets)
		n.states[m.Module] = st
		return st
	}
	st.Reissue(m.Buckets)
	return st
}

// State returns the state surface the node serves module, false when the
// module is not declared on the node.
func (n *Node) State(module string) (*state.Store, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.states[module]
	return st, ok
}

// serveState serves module's state on its socket while it is declared with
// buckets (want); a socket already served is kept, one no longer wanted is
// stopped.
func (n *Node) serveState(ctx context.Context, module string, st *state.Store, want bool) error {
	if !want {
		n.stopSocket(module)
		return nil
	}
	n.mu.Lock()
	_, ok := n.sockets[module]
	n.mu.Unlock()
	if ok {
		return nil
	}
	path := state.SocketPath(n.cfg.StateDir, module)
	ln, err := state.Listen(path)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &carried{cancel: cancel, done: make(chan struct{})}
	n.mu.Lock()
	n.sockets[module] = c
	n.mu.Unlock()
	n.log.Info("serving module state", "module", module, "socket", path)
	go func() {
		defer close(c.done)
		if err := state.Serve(sctx, ln, st, n.log.With("module", module)); err != nil {
			n.log.Error("state socket stopped", "module", module, "err", err)
		}
	}()
	return nil
}

// stopSocket stops serving module's state and removes its socket.
func (n *Node) stopSocket(module string) {
	n.mu.Lock()
	c, ok := n.sockets[module]
	delete(n.sockets, module)
	n.mu.Unlock()
	if !ok {
		return
	}
	c.cancel()
	<-c.done
	_ = os.Remove(state.SocketPath(n.cfg.StateDir, module))
}
