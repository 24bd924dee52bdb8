package cascade

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/registry"
)

// # Platforms
//
// A module built for one platform has one ask, its module's ask id, and its
// built event's digest is the module's image, as before. A module built for
// several (build.platforms) has one ask per platform ([PlatformAskID]),
// each published on its platform's subject so that only a machine of that
// platform receives it, and its status lists them ([ModuleStatus.Platforms]).
// Each platform's built records that platform's manifest; when every one is
// built the module is not built yet: [State.Unindexed] names it, the caller
// pushes an OCI image index of the manifests, and a built event carrying
// the module's own ask id and the index digest makes the module built (its
// digest, current image and what dependents are pinned to). A failed
// platform fails the module. Cancelling cancels every platform's ask.

// PlatformStatus is one platform's ask of a module built for several.
type PlatformStatus struct {
	Platform string      `json:"platform"`
	Ask      string      `json:"ask"`
	State    ModuleState `json:"state"`
	// Digest is the platform's manifest, from its built event.
	Digest string `json:"digest,omitempty"`
	On     string `json:"on,omitempty"`
	// Delivery is the delivery of the platform's ask its machine began
	// (ModuleStatus.Delivery).
	Delivery int `json:"delivery,omitempty"`
	// Attestations are what the platform's image was pushed with (its
	// provenance and SBOM, by digest). The module's index, assembled from
	// the platforms' image manifests, does not carry them: it is a pure
	// function of the images, so that it stays reproducible. The index the
	// tag latest names does (registry.PushIndex).
	Attestations *mesh.Attestations `json:"attestations,omitempty"`
}

// PlatformAskID derives the ask id of one platform's ask of a module built
// for several: the module's ask id with the platform's token
// (p-1a2b3c4d5e6f-runtime-linux-arm64-1), cut and hashed like AskID.
func PlatformAskID(planID, module, platform string, attempt int) string {
	return AskID(planID, module+"-"+mesh.PlatformToken(platform), attempt)
}

// platformsOf is a module's platforms, defaulted.
func platformsOf(m ModuleStatus) []string {
	if len(m.Source.Platforms) == 0 {
		return []string{mesh.DefaultPlatform}
	}
	return m.Source.Platforms
}

// askPlatforms sets a module's platform asks for its current attempt: one
// per platform for a module built for several, none for one.
func (s *State) askPlatforms(m *ModuleStatus) {
	m.Platforms = nil
	ps := platformsOf(*m)
	if len(ps) < 2 {
		return
	}
	for _, p := range ps {
		m.Platforms = append(m.Platforms, PlatformStatus{
			Platform: p, Ask: PlatformAskID(s.Plan, m.Module, p, m.Attempt), State: Queued,
		})
	}
}

// platformAsk finds the module and platform a platform ask id names.
func (s *State) platformAsk(plan, module, ask string) (int, int, bool) {
	s.ensure()
	if plan != "" && plan != s.Plan {
		return 0, 0, false
	}
	i, ok := s.ix.pos[module]
	if !ok || ask == "" {
		return 0, 0, false
	}
	for k, p := range s.Modules[i].Platforms {
		if p.Ask == ask {
			return i, k, true
		}
	}
	return 0, 0, false
}

func (s *State) platformStarted(i, k int, ev mesh.Started) bool {
	m := &s.Modules[i]
	p := &m.Platforms[k]
	switch {
	case m.State == Queued || m.State == Building:
		if p.State != Queued && (p.State != Building || ev.On == p.On && !later(ev.Attempt, p.Delivery)) {
			return false
		}
		if p.State == Building && p.On != "" {
			// The platform's machine went silent (see Started).
			m.lost(p.On, p.Platform, time.Time{}, ev)
		}
		if p.State == Queued {
			m.silentBefore(p.Platform, ev.Attempt, ev.At, ev.On)
		}
		p.State, p.On, p.Delivery = Building, ev.On, ev.Attempt
		if m.State == Queued {
			s.set(m, Building)
			m.Started = ev.At
		}
	case m.State == Cancelling && p.State == Queued:
		p.State, p.On = Building, ev.On
		if m.Started.IsZero() {
			m.Started = ev.At
		}
	default:
		return false
	}
	m.On, m.HandedBack = machinesOf(m.Platforms), nil
	m.held(ev.On)
	s.touch(ev.At)
	return true
}

// platformBuilt records one platform's manifest; the module is built when
// its index is (see Unindexed).
func (s *State) platformBuilt(i, k int, ev mesh.Built, now time.Time) {
	m := &s.Modules[i]
	p := &m.Platforms[k]
	switch {
	case m.State == Cancelling && (p.State == Queued || p.State == Building):
		p.State = Cancelled
		s.platformStopped(m, ev.On, "", "built after the plan was cancelled: "+ev.Image, now)
	case (m.State == Queued || m.State == Building) && (p.State == Queued || p.State == Building):
		if m.State == Queued {
			// No platform announced started (each ended within the
			// agent's StartedDelay): building, since its first platform
			// began.
			s.set(m, Building)
			s.builtUnstarted(m, ev.On, ev.At, ev.Duration)
		}
		m.held(ev.On) // its started may not have been due (builtUnstarted)
		if p.State == Queued {
			m.silentBefore(p.Platform, ev.Attempt, ev.At.Add(-max(0, ev.Duration)), ev.On)
		}
		p.State, p.Digest, p.Attestations = Built, ev.Digest, ev.Attestations
		m.Commit = ev.Commit
		if ev.On != "" {
			p.On = ev.On
		}
		m.On = machinesOf(m.Platforms)
		s.touch(now)
	}
}

// platformFailed fails the module (a module is built for every platform or
// not at all), or, when cancelling, records the platform stopped.
func (s *State) platformFailed(i, k int, ev mesh.Failed, now time.Time) []string {
	m := &s.Modules[i]
	p := &m.Platforms[k]
	if p.State != Queued && p.State != Building {
		return nil
	}
	if m.State == Cancelling {
		p.State = Cancelled
		s.platformStopped(m, ev.On, ev.Reason, ev.Message, now)
		return nil
	}
	if m.State != Queued && m.State != Building {
		return nil
	}
	p.State = Failed
	if ev.On != "" {
		p.On = ev.On
	}
	ev.Ask, ev.Message = m.Ask, p.Platform+": "+ev.Message
	return s.Failed(ev, now)
}

// platformStopped cancels a cancelling module once none of its platform
// asks is still in a holder's hands.
func (s *State) platformStopped(m *ModuleStatus, on, reason, message string, now time.Time) {
	for _, p := range m.Platforms {
		if p.State == Queued || p.State == Building {
			s.touch(now)
			return
		}
	}
	s.stopped(m, on, reason, message, now)
}

// inFlightAsks are the asks of a module a holder may hold: its own, or
// those of its platforms not yet finished.
func inFlightAsks(m ModuleStatus) []string {
	if len(m.Platforms) == 0 {
		return []string{m.Ask}
	}
	var out []string
	for _, p := range m.Platforms {
		if p.State == Queued || p.State == Building {
			out = append(out, p.Ask)
		}
	}
	return out
}

func allBuilt(ps []PlatformStatus) bool {
	for _, p := range ps {
		if p.State != Built {
			return false
		}
	}
	return len(ps) > 0
}

func machinesOf(ps []PlatformStatus) string {
	var on []string
	for _, p := range ps {
		if p.On != "" && !slices.Contains(on, p.On) {
			on = append(on, p.On)
		}
	}
	slices.Sort(on)
	return strings.Join(on, ",")
}

// Manifest is one platform's image of a module built for several.
type Manifest = registry.IndexManifest

// Unindexed is a module every platform of which is built, and whose index
// is to be pushed: the caller assembles Manifests into an OCI image index,
// pushes it by digest and reports it with a built event carrying Ask (the
// module's own ask id) and the index digest.
type Unindexed struct {
	Plan      string     `json:"plan"`
	Module    string     `json:"module"`
	Ask       string     `json:"ask"`
	Manifests []Manifest `json:"manifests"`
}

// Unindexed returns the modules whose every platform is built and whose
// index is not yet recorded, in plan order. It changes nothing: after a
// restart, the same modules are returned until their index is.
func (s *State) Unindexed() []Unindexed {
	if s.ensure(); !s.ix.multi {
		return nil // no module is built for several platforms
	}
	var out []Unindexed
	for _, m := range s.Modules {
		if (m.State != Queued && m.State != Building) || !allBuilt(m.Platforms) {
			continue
		}
		u := Unindexed{Plan: s.Plan, Module: m.Module, Ask: m.Ask}
		for _, p := range m.Platforms {
			mf := Manifest{Platform: p.Platform, Digest: p.Digest}
			if p.Attestations != nil {
				mf.Attestation = p.Attestations.Manifest
			}
			u.Manifests = append(u.Manifests, mf)
		}
		out = append(out, u)
	}
	return out
}

// NoMachine is the note of an ask waiting for a platform no online holder
// builds.
func NoMachine(platforms []string) string {
	return fmt.Sprintf("no %s machine online", strings.Join(platforms, ", "))
}

// Unserved marks the asks waiting for a platform no holder builds now:
// each queued module (or platform ask of a module built for several) whose
// platform served reports false gets the note "no linux/arm64 machine
// online" in Waiting, and loses it when a holder of the platform is back.
// It returns the modules whose note changed, and how many asks wait
// unserved.
func (s *State) Unserved(served func(platform string) bool) (changed []string, asks int) {
	for i := range s.Modules {
		m := &s.Modules[i]
		var missing []string
		switch {
		case m.State != Queued && m.State != Building:
		case len(m.Platforms) == 0:
			if p := platformsOf(*m)[0]; m.State == Queued && !served(p) {
				missing = append(missing, p)
			}
		default:
			for _, p := range m.Platforms {
				if p.State == Queued && !served(p.Platform) {
					missing = append(missing, p.Platform)
				}
			}
		}
		asks += len(missing)
		note := ""
		if len(missing) > 0 {
			note = NoMachine(missing)
		}
		if note != m.Waiting {
			m.Waiting = note
			changed = append(changed, m.Module)
		}
	}
	return changed, asks
}

// assemble pushes the image index of every module whose platforms are all
// built (State.Unindexed) and records it as the module's built: the index
// digest is its digest, its current image and what its dependents are
// pinned to. It looks at the plans the batch changed, or at every plan
// (all: on the tick, to retry an index the registry refused). It reports
// whether any module was built so.
func (c *Controller) assemble(ctx context.Context, all bool) bool {
	if c.lostSeat("pushing image indexes") {
		return false
	}
	some := false
	for id, st := range c.plans {
		if !all && !c.dirtyRun[id] {
			continue
		}
		for _, u := range st.Unindexed() {
			begun := time.Now()
			rctx, cancel := context.WithTimeout(ctx, c.cfg.ResolveTimeout)
			ms, _ := st.Module(u.Module)
			dg, err := c.cfg.RegistryClient.PushIndex(rctx, c.Image(u.Module), u.Manifests, indexAnnotations(ms))
			cancel()
			if err != nil {
				c.log.Warn("pushing a module's image index; retrying on the next tick", "plan", id, "module", u.Module, "err", err)
				continue
			}
			c.log.Info("pushed an image index", "plan", id, "module", u.Module, "digest", dg, "platforms", len(u.Manifests), "took", time.Since(begun))
			c.built(st, mesh.Built{
				Version: mesh.AskVersion, Ask: u.Ask, Plan: id, Module: u.Module, Commit: ms.Commit,
				Digest: dg, Image: c.Image(u.Module) + "@" + dg, On: ms.On, At: time.Now().UTC(),
			}, time.Now().UTC())
			some = true
		}
	}
	return some
}
