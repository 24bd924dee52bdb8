package cascade

import (
	"context"
	"fmt"
	"time"
)

// Current is a module's current image and the plan that built it.
type Current struct {
	Module string `json:"module"`
	Digest string `json:"digest"`
	Image  string `json:"image,omitempty"`
	Commit string `json:"commit,omitempty"`
	Plan   string `json:"plan"`
	// Seq is the plan's sequence number.
	Seq uint64 `json:"seq"`
	// Created is the plan's creation time.
	Created time.Time `json:"created"`
	// Inputs are the components of the input key it was built from.
	Inputs *KeyInputs `json:"inputs,omitempty"`
	// Duration is how long its build took: the module's estimate (asks
	// are ranked by it) for a restarted controller, when no estimate key
	// holds one (Controller.built writes that only when the current
	// record does not carry the build's duration).
	Duration time.Duration `json:"duration,omitempty"`
}

// Newer reports whether a may replace b as a module's current image: a's
// plan has a higher sequence number, or the same and a later creation time.
// A zero b is replaced by anything with a sequence or a time; equal plans
// replace nothing.
func Newer(a, b Current) bool {
	if a.Seq != b.Seq {
		return a.Seq > b.Seq
	}
	return a.Created.After(b.Created)
}

// Current returns a built module's result as a candidate current image.
func (s *State) Current(module string) (Current, bool) {
	m, ok := s.Module(module)
	if !ok || !m.State.done() {
		return Current{}, false
	}
	return Current{Module: m.Module, Digest: m.Digest, Image: m.Image, Commit: m.Commit, Plan: s.Plan,
		Seq: s.Seq, Created: s.Created, Inputs: m.Inputs, Duration: m.Duration}, true
}

// setCurrent makes a module's image in a plan its current one, if the plan
// is newer than the one that made the current one. It reports whether it
// did (the record is to be written).
func (c *Controller) setCurrent(st *State, module string) bool {
	cur, ok := st.Current(module)
	if !ok || !Newer(cur, c.current[module]) {
		return false
	}
	c.current[module] = cur
	if c.dirty == nil {
		c.dirty, c.dirtyRun = map[string]any{}, map[string]bool{}
	}
	c.dirty[CurrentKey(module)] = cur
	return true
}

// currentDigest is a base's current digest: the newest plan's result, or
// else the identity of what the registry's latest tag names now (the
// image, not the index of it and its attestations: registry.Identity).
func (c *Controller) currentDigest(ctx context.Context, module string) (string, error) {
	if cur, ok := c.current[module]; ok && cur.Digest != "" {
		return cur.Digest, nil
	}
	ref := c.Image(module) + ":latest"
	rctx, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
	defer cancel()
	dg, err := c.cfg.RegistryClient.Identity(rctx, ref)
	if err != nil {
		return "", fmt.Errorf("%w: base %s (%s: %v): build it first with `builds rebuild %s`", ErrNoBase, module, ref, err, module)
	}
	return dg, nil
}
