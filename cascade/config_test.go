package cascade

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/planner"
)

func TestAZeroConfigFieldIsItsDefault(t *testing.T) {
	got := Config{Registry: "r:5000"}.withDefaults()
	want := Config{Registry: "r:5000", Replicas: 1, Batch: DefaultBatch, KeepPlans: DefaultKeepPlans,
		ObserveEvery: DefaultObserveEvery, IdleLook: DefaultIdleLook, PublishAckWait: DefaultPublishAckWait,
		ResolveTimeout: DefaultResolveTimeout, PruneEvery: DefaultPruneEvery, CancelWait: DefaultCancelWait,
		ToolTimeout: DefaultToolTimeout, StoreRetryFor: DefaultStoreRetryFor, ShareHalfLife: DefaultShareHalfLife,
		StartedStoreDelay: DefaultStartedStoreDelay,
		Images:            registryImages{}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("defaults %+v\nwant %+v", got, want)
	}
	if d := DefaultConfig(); d.Window != WindowIdle || d.Batch != DefaultBatch {
		t.Errorf("DefaultConfig %+v", d)
	}
	set := Config{Registry: "r", CancelWait: time.Second, Batch: 3}.withDefaults()
	if set.CancelWait != time.Second || set.Batch != 3 {
		t.Errorf("a set field was replaced: %+v", set)
	}
}

func TestValidateRefusesWhatNoDefaultMends(t *testing.T) {
	for name, c := range map[string]Config{
		"no registry":      {},
		"window":           {Registry: "r", Window: -2},
		"negative batch":   {Registry: "r", Batch: -1},
		"negative cancel":  {Registry: "r", CancelWait: -time.Second},
		"negative resolve": {Registry: "r", ResolveTimeout: -1},
	} {
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	if err := (Config{Registry: "r"}).Validate(); err != nil {
		t.Errorf("a zero config with a registry: %v", err)
	}
}

func TestTheAskIsAPureFunctionOfTheSubmit(t *testing.T) {
	s := Submit{Plan: "p-1", Module: "tool", AskID: "p-1-tool-1", Attempt: 1,
		Source: planner.Source{Repo: "https://git.example/t.git", Path: "tool", Dockerfile: "Dockerfile", Platforms: []string{"linux/arm64"}},
		Bases:  map[string]string{"zeta": "sha256:2", "alpha": "sha256:1"}}
	asks := Asks("reg:5000", s)
	if len(asks) != 1 || asks[0].ID != s.AskID {
		t.Fatalf("asks %+v, want one, the submit's id", asks)
	}
	a := asks[0]
	if a.Source.Commit != "HEAD" || a.Platform != "linux/arm64" || a.Image != "reg:5000/tool" || a.Cache != "reg:5000/tool:buildcache" {
		t.Errorf("ask %+v", a)
	}
	if len(a.Bases) != 2 || a.Bases[0].Module != "alpha" || a.Bases[0].Ref() != "reg:5000/alpha@sha256:1" || a.Bases[1].Module != "zeta" {
		t.Errorf("bases %+v, want both, sorted, pinned", a.Bases)
	}
	if !reflect.DeepEqual(asks, Asks("reg:5000", s)) {
		t.Error("the same submit gave another ask")
	}
}

// A module built for several platforms has one ask per platform, each with
// its own id, platform and build cache, and the same source and bases.
func TestAModuleOfTwoPlatformsHasAnAskForEach(t *testing.T) {
	s := Submit{Plan: "p-1", Module: "tool", AskID: "p-1-tool-2", Attempt: 2,
		Source: planner.Source{Repo: "https://git.example/t.git", Path: "tool", Platforms: []string{"linux/amd64", "linux/arm64"}},
		Bases:  map[string]string{"alpha": "sha256:1"}}
	asks := Asks("reg:5000", s)
	if len(asks) != 2 {
		t.Fatalf("%d asks, want 2", len(asks))
	}
	for i, want := range []struct{ id, platform, cache string }{
		{"p-1-tool-linux-amd64-2", "linux/amd64", "reg:5000/tool:buildcache-linux-amd64"},
		{"p-1-tool-linux-arm64-2", "linux/arm64", "reg:5000/tool:buildcache-linux-arm64"},
	} {
		a := asks[i]
		if a.ID != want.id || a.Platform != want.platform || a.Cache != want.cache || a.Image != "reg:5000/tool" || len(a.Bases) != 1 {
			t.Errorf("ask %d: %+v, want id %s platform %s cache %s", i, a, want.id, want.platform, want.cache)
		}
		if a.ID != PlatformAskID(s.Plan, s.Module, want.platform, s.Attempt) {
			t.Errorf("ask %d id %s is not PlatformAskID's", i, a.ID)
		}
	}
}

func TestToolErrorsMatchTheirSentinelsOnce(t *testing.T) {
	for _, c := range toolCodes {
		err := toolCodes.Error(codeOf(c.Sentinels[0]), "x")
		for _, s := range c.Sentinels {
			if !errors.Is(err, s) {
				t.Errorf("code %s does not match %v", c.Code, s)
			}
		}
		if c.Code != "no-plan" && errors.Is(err, ErrNoPlan) {
			t.Errorf("code %s matches ErrNoPlan", c.Code)
		}
	}
	if got := codeOf(errors.New("anything")); got != "bad-request" {
		t.Errorf("an unclassified error has code %s", got)
	}
}
