package mesh

import (
	"strings"
	"time"
)

// What the build agent keeps per machine (ADR 0201: "the farm uses it"):
// after each build it settles, an agent writes one BuildRecord under
// BuildRecordKey(module, machine) in its own state, AgentBuildsBucket,
// through the state surface the node runtime issued it. The controller
// reads the bucket (its manifest's `reads: [build-agent.builds]`,
// AgentBuildsRef) and an operator with `builds state get build-agent.builds
// KEY`:
//
//	build-agent.builds   tool-01.m1 → {"module":"tool-01","machine":"m1","outcome":"built",
//	                                   "duration":41200000000,"at":"…","digest":"sha256:…",…}
//
// One value per key (history 1): the last build of the module on the
// machine, whatever came before.

// AgentBuildsBucket is the build agent's own name for the bucket it keeps
// its build records in (its manifest's state: builds).
const AgentBuildsBucket = "builds"

// AgentBuildsRef is how another module names the agent's bucket under
// reads: "build-agent.builds".
func AgentBuildsRef() string { return AgentModule + "." + AgentBuildsBucket }

// BuildRecordVersion is the version of BuildRecord this code writes.
const BuildRecordVersion = 1

// BuildRecord is a machine's last build of a module: what an agent learns
// and keeps. Outcome is EventBuilt or EventFailed.
type BuildRecord struct {
	Version  int           `json:"version"`
	Module   string        `json:"module"`
	Machine  string        `json:"machine"`
	Platform string        `json:"platform,omitempty"`
	Outcome  string        `json:"outcome"`
	Duration time.Duration `json:"duration"`
	At       time.Time     `json:"at"`
	// Digest and Commit are a built image's; Reason a failure's class
	// (Reason*).
	Digest string `json:"digest,omitempty"`
	Commit string `json:"commit,omitempty"`
	Reason string `json:"reason,omitempty"`
	Plan   string `json:"plan,omitempty"`
	Ask    string `json:"ask,omitempty"`
}

// BuildRecordKey is the key of machine's record of module:
// "<module>.<machine>". A module's name holds no dot, so the key splits
// back at its first (SplitBuildRecordKey); a character a key may not hold
// in the machine's name is written '-'.
func BuildRecordKey(module, machine string) string {
	m := strings.Trim(strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '=', r == '.':
			return r
		}
		return '-'
	}, machine), ".")
	for strings.Contains(m, "..") {
		m = strings.ReplaceAll(m, "..", ".")
	}
	if m == "" {
		m = "-"
	}
	return module + "." + m
}

// SplitBuildRecordKey returns the module and machine a record's key names.
func SplitBuildRecordKey(key string) (module, machine string, ok bool) {
	module, machine, ok = strings.Cut(key, ".")
	return module, machine, ok && ValidName(module) && machine != ""
}
