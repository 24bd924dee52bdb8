package mesh

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// The build seat's contract: what is asked of node-build-agent and what its
// holders announce. Every payload carries a version; a holder refuses a
// version it does not know.

// AskVersion is the version of the build ask this code speaks.
const AskVersion = 1

// BuildSeat is the seat that builds images, and BuildVerb its verb.
const (
	BuildSeat = "node-build-agent"
	BuildVerb = "build"
)

// Events the build seat emits.
const (
	EventStarted = "started"
	EventBuilt   = "built"
	EventFailed  = "failed"
	// EventHandedBack is announced when a holder gives an ask back to the
	// queue unfinished (HandedBack): to be retried after a delay, or at
	// once because the machine cannot build. It is a note for people
	// (`builds show`), not an outcome: the ask is still in flight.
	EventHandedBack = "handed-back"
)

// Reason classes of a failed build.
const (
	ReasonAsk    = "ask"    // malformed ask, unknown version, unknown module
	ReasonSource = "source" // commit, path or Dockerfile missing
	ReasonBuild  = "build"  // the Dockerfile failed
	ReasonPush   = "push"   // the registry refused the image (4xx)
	ReasonInfra  = "infra"  // buildkitd or the registry unreachable, after retries
	ReasonCancel = "cancelled"
)

// Source is where a module's build context comes from.
type Source struct {
	Repo       string `json:"repo"`
	Commit     string `json:"commit"`
	Path       string `json:"path,omitempty"`
	Dockerfile string `json:"dockerfile,omitempty"`
	// Tree is the git tree of Path at Commit (its object name), when the
	// controller read it: an agent whose clone holds that tree builds it
	// without fetching the commit (a new commit that left the module's
	// own sources as they were). Empty: the agent finds it at the commit.
	Tree string `json:"tree,omitempty"`
	// NoProvenance and NoSBOM turn the image's provenance attestation and
	// its SBOM off for this module (build.provenance: false, build.sbom:
	// false); an agent attaches each otherwise, as it is configured to.
	NoProvenance bool `json:"no_provenance,omitempty"`
	NoSBOM       bool `json:"no_sbom,omitempty"`
	// Compression is the image's layer compression, build.compression:
	// empty for gzip (the default; the controller sends nothing for it),
	// else CompressionZstd.
	Compression string `json:"compression,omitempty"`
}

// Attestations are what was pushed with an image: the index holding the
// image and its attestation manifest, and the attestations in it, each by
// digest. The image's digest (Built.Digest) is the image manifest's, not
// the index's: the image is reproducible, its provenance (which records
// when it was built) is not.
type Attestations struct {
	// Index is the pushed index: the image manifest and its attestation
	// manifest.
	Index string `json:"index"`
	// Manifest is the attestation manifest (annotated
	// vnd.docker.reference.type=attestation-manifest).
	Manifest string `json:"manifest"`
	// Provenance is the in-toto statement of the SLSA provenance, a layer
	// of Manifest; empty without one.
	Provenance string `json:"provenance,omitempty"`
	// SBOM is the in-toto statement of the SPDX SBOM, a layer of
	// Manifest; empty without one.
	SBOM string `json:"sbom,omitempty"`
}

// Base is one base image of a build, pinned to a digest.
type Base struct {
	Module string `json:"module"`
	// Image is the base's repository in the registry, without tag or digest
	// (e.g. "127.0.0.1:5000/runtime").
	Image  string `json:"image"`
	Digest string `json:"digest"`
}

// Ref is the base's pinned reference, repository@digest.
func (b Base) Ref() string { return b.Image + "@" + b.Digest }

// Ask is one build asked of the build seat.
type Ask struct {
	Version  int    `json:"version"`
	ID       string `json:"id"`
	Plan     string `json:"plan"`
	Module   string `json:"module"`
	Source   Source `json:"source"`
	Platform string `json:"platform,omitempty"`
	// Image is the target repository, without tag or digest; the agent
	// pushes it by digest and tags it latest (the tag is a convenience for
	// people; the mesh builds on the digest).
	Image string `json:"image"`
	Bases []Base `json:"bases,omitempty"`
	// Cache is the registry reference build cache is imported from and
	// exported to; empty for none.
	Cache string `json:"cache,omitempty"`
	// Key is the ask's input key: a hash of the module, the platform, the
	// git tree of its build context, its Dockerfile and every base's
	// digest (cascade.InputKey). The controller keeps the digest each key
	// was built to; empty when the build context is not addressed.
	Key string `json:"key,omitempty"`
	// Secret is known only to the controller and to the machines the ask
	// is delivered to (the queue is read through each machine's own
	// consumer; no other principal may read the ask stream). Every outcome
	// of the ask carries AskProof(Secret, ID, machine): the controller
	// applies outcomes only from a machine that was delivered the ask, so
	// a machine that merely predicts an ask's id (they are derived from
	// the plan) cannot announce it started or built.
	Secret string `json:"secret,omitempty"`
}

// AskProof is what an outcome of ask id announced by machine carries to
// show the machine was delivered the ask: an HMAC-SHA256 of the id and the
// machine under the ask's secret, in hex. Another machine's proof (events
// are read by every machine) proves nothing for it. Empty for an ask with
// no secret.
func AskProof(secret, id, machine string) string {
	if secret == "" {
		return ""
	}
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(machine))
	return hex.EncodeToString(h.Sum(nil))
}

// ValidAskProof reports whether proof is AskProof(secret, id, machine),
// in constant time.
func ValidAskProof(proof, secret, id, machine string) bool {
	want := AskProof(secret, id, machine)
	return want != "" && hmac.Equal([]byte(proof), []byte(want))
}

var (
	// ErrMalformedAsk is wrapped by every refusal of an ask's payload.
	ErrMalformedAsk = errors.New("malformed ask")
	// ErrAskVersion is wrapped when an ask's version is not AskVersion.
	ErrAskVersion = errors.New("unknown ask version")

	digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
	idRE     = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	objectRE = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)
)

// GitObjectName reports whether s is a full git object name (SHA-1 or
// SHA-256): a commit or tree named so names the same content for ever.
func GitObjectName(s string) bool { return objectRE.MatchString(s) }

// ValidAskID reports whether id can be an ask's id (and a claim's key).
func ValidAskID(id string) bool { return idRE.MatchString(id) }

// DecodeAsk parses and checks an ask. Every error wraps ErrMalformedAsk or
// ErrAskVersion and says which field is wrong.
func DecodeAsk(data []byte) (Ask, error) {
	var a Ask
	if err := json.Unmarshal(data, &a); err != nil {
		return Ask{}, fmt.Errorf("%w: %v", ErrMalformedAsk, err)
	}
	if a.Version != AskVersion {
		return a, fmt.Errorf("%w: version %d, this agent speaks %d", ErrAskVersion, a.Version, AskVersion)
	}
	return a, a.Validate()
}

// Validate checks every field an agent needs.
func (a Ask) Validate() error {
	bad := func(field, why string) error { return fmt.Errorf("%w: %s: %s", ErrMalformedAsk, field, why) }
	switch {
	case !idRE.MatchString(a.ID):
		return bad("id", "want 1-128 of [A-Za-z0-9_-]")
	case a.Plan == "":
		return bad("plan", "empty")
	case !nameRE.MatchString(a.Module):
		return bad("module", fmt.Sprintf("%q is not a module name", a.Module))
	case a.Source.Repo == "":
		return bad("source.repo", "empty")
	case a.Source.Commit == "":
		return bad("source.commit", "empty")
	case a.Source.Tree != "" && !GitObjectName(a.Source.Tree):
		return bad("source.tree", fmt.Sprintf("%q is not a git object name (40 or 64 hex digits)", a.Source.Tree))
	case a.Image == "":
		return bad("image", "empty")
	case a.Source.Compression != "" && a.Source.Compression != CompressionGzip && a.Source.Compression != CompressionZstd:
		return bad("source.compression", fmt.Sprintf("%q: this agent compresses layers with %s (empty, the default) or %s", a.Source.Compression, CompressionGzip, CompressionZstd))
	}
	for i, b := range a.Bases {
		if !nameRE.MatchString(b.Module) || b.Image == "" || !digestRE.MatchString(b.Digest) {
			return bad(fmt.Sprintf("bases[%d]", i), "want module, image and a sha256 digest")
		}
	}
	return nil
}

// Started is announced when a holder begins an ask.
type Started struct {
	Version int       `json:"version"`
	Ask     string    `json:"ask"`
	Plan    string    `json:"plan"`
	Module  string    `json:"module"`
	On      string    `json:"on"`
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
	// Proof shows On was delivered the ask (AskProof).
	Proof string `json:"proof,omitempty"`
}

// Built is announced when an image is pushed and resolvable by digest.
type Built struct {
	Version int    `json:"version"`
	Ask     string `json:"ask"`
	Plan    string `json:"plan"`
	Module  string `json:"module"`
	Commit  string `json:"commit"`
	Digest  string `json:"digest"`
	Image   string `json:"image"` // repository@digest
	On      string `json:"on"`
	// Attempt is the ask's delivery that was built (1 the first): the
	// controller accepts it only for the attempt the machine's claim
	// records.
	Attempt   int           `json:"attempt,omitempty"`
	Duration  time.Duration `json:"duration"`
	Bytes     int64         `json:"bytes"`
	CacheHits int           `json:"cache_hits"`
	Steps     int           `json:"steps"`
	At        time.Time     `json:"at"`
	// Attestations are the provenance and SBOM pushed with the image, if
	// any.
	Attestations *Attestations `json:"attestations,omitempty"`
	// Proof shows On was delivered the ask (AskProof).
	Proof string `json:"proof,omitempty"`
}

// Failed is announced once when an ask is settled without an image.
type Failed struct {
	Version int       `json:"version"`
	Ask     string    `json:"ask"`
	Plan    string    `json:"plan"`
	Module  string    `json:"module"`
	On      string    `json:"on"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Log     []string  `json:"log,omitempty"`
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
	// Proof shows On was delivered the ask (AskProof).
	Proof string `json:"proof,omitempty"`
}

// HandedBack is announced when a holder gives an ask back to the queue
// unfinished, after it settled its claim of the ask as released (so the
// controller can check that the machine whose claim records the release,
// for this attempt, says so). Why is the cause in the holder's words ("git
// fetch …: connection refused", "registry 127.0.0.1:5000 does not answer:
// …"); InfraSince is when the ask began failing on infrastructure on any
// machine (the start of its --retry-for budget); Next is when it is due
// again (a retry after a delay; zero: at once); Sick says the machine
// itself cannot build (its probe fails), so the ask waits for a healthy
// machine.
type HandedBack struct {
	Version    int       `json:"version"`
	Ask        string    `json:"ask"`
	Plan       string    `json:"plan"`
	Module     string    `json:"module"`
	On         string    `json:"on"`
	Attempt    int       `json:"attempt"`
	Why        string    `json:"why"`
	InfraSince time.Time `json:"infra_since,omitzero"`
	Next       time.Time `json:"next,omitzero"`
	Sick       bool      `json:"sick,omitempty"`
	At         time.Time `json:"at"`
	// Proof shows On was delivered the ask (AskProof).
	Proof string `json:"proof,omitempty"`
}

// LogBatch is a batch of a build's output, published on log.<ask>.
type LogBatch struct {
	Ask   string   `json:"ask"`
	On    string   `json:"on"`
	Seq   int      `json:"seq"`
	Lines []string `json:"lines"`
	Final bool     `json:"final,omitempty"`
}

// StatusTool is the build seat's tool every holder answers with its
// status (agent.Status), scatter-gather: the operator's `builds machines`,
// and a sick machine asking whether a healthy one is online before it
// fails an ask "no healthy machine".
const StatusTool = "status"

// CancelTool is the build seat's tool that cuts short the builds of a
// cancelled plan: a request is broadcast to every holder, and each cancels
// the asks it is working on.
const CancelTool = "cancel"

// Cancel is the payload of a CancelTool request.
type Cancel struct {
	Asks []string `json:"asks"`
}
