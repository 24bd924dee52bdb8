package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/planner"
)

// Image is module m's image repository in a registry: registry/m.
func Image(registry, module string) string { return registry + "/" + module }

// Asks are the build asks of a submit, for images in registry: a pure
// function of the two, one per platform of the module, in the order of
// build.platforms. Every base is pinned to the digest the submit carries
// (in-plan bases at the digests the plan built them at, the others at the
// digests resolved when the plan was made), sorted by module; an empty
// commit (a module of another repository than the push's) asks for the
// repository's HEAD. A module built for one platform has one ask, the
// submit's id; one built for several has one per platform
// (PlatformAskID), each with its own build cache. Each is published on its
// platform's subject (mesh.BuildSubject).
//
// The ask path is one way: planner.Plan → State (pinned when the plan is
// made) → Submit → Asks, published by the controller.
func Asks(registry string, s Submit) []mesh.Ask {
	a := mesh.Ask{
		Version: mesh.AskVersion, ID: s.AskID, Plan: s.Plan, Module: s.Module,
		Source: s.Source.Mesh(),
		Image:  Image(registry, s.Module), Cache: Image(registry, s.Module) + ":buildcache",
		Key: s.Key,
	}
	if a.Source.Commit == "" {
		a.Source.Commit = "HEAD"
	} else {
		a.Source.Tree = s.Tree // read at this commit
	}
	for _, b := range slices.Sorted(maps.Keys(s.Bases)) {
		a.Bases = append(a.Bases, mesh.Base{Module: b, Image: Image(registry, b), Digest: s.Bases[b]})
	}
	platforms, ids := s.platformAsks()
	if len(platforms) == 1 {
		a.Platform = platforms[0]
		return []mesh.Ask{a}
	}
	out := make([]mesh.Ask, len(platforms))
	for i, p := range platforms {
		out[i] = a
		out[i].Bases = slices.Clone(a.Bases)
		out[i].ID = ids[i]
		out[i].Platform = p
		out[i].Cache = a.Cache + "-" + mesh.PlatformToken(p)
	}
	return out
}

// platformAsks are the platforms s is built for (the default platform
// when it names none), each with its ask's id: the submit's own for one
// platform, PlatformAskID's for several.
func (s Submit) platformAsks() (platforms, ids []string) {
	platforms = s.Source.Platforms
	if len(platforms) == 0 {
		platforms = []string{mesh.DefaultPlatform}
	}
	if len(platforms) == 1 {
		return platforms, []string{s.AskID}
	}
	ids = make([]string, len(platforms))
	for i, p := range platforms {
		ids[i] = PlatformAskID(s.Plan, s.Module, p, s.Attempt)
	}
	return platforms, ids
}

// Push announces a push as mesh-git does, and returns the id of the plan
// it makes: the one place a mesh.Pushed is published (the CLI's push and the
// demo call it). The message id is the plan id, so that announcing one push
// twice makes one plan. A zero At is now.
func Push(ctx context.Context, js jetstream.JetStream, ev mesh.Pushed) (id string, duplicate bool, err error) {
	ev.Version = mesh.PushedVersion
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	id = planner.PlanID(planner.Trigger{Kind: planner.KindPush, Repo: ev.Repo, Commit: ev.Commit, Ref: ev.Ref, Paths: ev.Paths})
	data, err := json.Marshal(ev)
	if err != nil {
		return "", false, err
	}
	subj := mesh.SeatEventSubject(mesh.GitSeat, mesh.EventPushed)
	ack, err := js.Publish(ctx, subj, data, jetstream.WithMsgID(id))
	if err != nil {
		return id, false, fmt.Errorf("announcing the push of %s %s on %s: %w", ev.Repo, ev.Commit, subj, err)
	}
	return id, ack.Duplicate, nil
}
