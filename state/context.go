package state

import "context"

type ctxKey struct{}

// NewContext returns ctx carrying a module's state surface: how the node
// runtime hands it to a module it carries in-process.
func NewContext(ctx context.Context, s Surface) context.Context {
	return context.WithValue(ctx, ctxKey{}, s)
}

// FromContext returns the state surface the runtime gave a carried module;
// ok is false when it gave none (the module runs outside a node runtime).
func FromContext(ctx context.Context) (s Surface, ok bool) {
	s, ok = ctx.Value(ctxKey{}).(Surface)
	return s, ok
}
