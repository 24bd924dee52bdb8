package mesh

import (
	"path"
	"strings"
	"time"
)

// Manifest is one module's declaration: one YAML file in a catalogue
// directory. It names things locally; it never contains a subject, stream,
// consumer or bucket name.
type Manifest struct {
	Module   string   `yaml:"module" json:"module"`
	Build    *Build   `yaml:"build,omitempty" json:"build,omitempty"`
	Seats    []Seat   `yaml:"seats,omitempty" json:"seats,omitempty"`
	Holds    []string `yaml:"holds,omitempty" json:"holds,omitempty"`
	Emits    []string `yaml:"emits,omitempty" json:"emits,omitempty"`
	Consumes []string `yaml:"consumes,omitempty" json:"consumes,omitempty"`
	Uses     []string `yaml:"uses,omitempty" json:"uses,omitempty"`
	Serves   []string `yaml:"serves,omitempty" json:"serves,omitempty"`
	State    []Bucket `yaml:"state,omitempty" json:"state,omitempty"`
	Reads    []string `yaml:"reads,omitempty" json:"reads,omitempty"`

	// File is the path the manifest was loaded from ("" for the mesh's own).
	File string `yaml:"-" json:"file,omitempty"`
}

// Build says how a module is built into an image.
type Build struct {
	Repo       string   `yaml:"repo" json:"repo"`
	Path       string   `yaml:"path,omitempty" json:"path,omitempty"`
	Dockerfile string   `yaml:"dockerfile,omitempty" json:"dockerfile,omitempty"`
	On         []string `yaml:"on,omitempty" json:"on,omitempty"`
	Platforms  []string `yaml:"platforms,omitempty" json:"platforms,omitempty"`
	// Provenance: false pushes the module's image without the provenance
	// attestation agents attach by default.
	Provenance *bool `yaml:"provenance,omitempty" json:"provenance,omitempty"`
	// SBOM: false pushes the module's image without the SBOM agents
	// configured with a generator attach.
	SBOM *bool `yaml:"sbom,omitempty" json:"sbom,omitempty"`
	// Compression is how the image's own layers are compressed:
	// CompressionGzip (the default, which every runtime pulls) or
	// CompressionZstd (BuildKit's zstd, OCI media types: pulled by
	// containerd 1.5, Docker 23 and later). Every build rewrites its
	// layers' file times to the SOURCE_DATE_EPOCH, so each export
	// compresses them again, a fully cached build too: zstd does that
	// several times faster than gzip, and smaller (BENCHMARKS.md).
	Compression string `yaml:"compression,omitempty" json:"compression,omitempty"`
	// Priority is the default priority of a plan pushed to the repository,
	// by ref: a branch name (main), a full ref (refs/tags/v1) or * for any
	// other ref. See PriorityFor.
	Priority map[string]int `yaml:"priority,omitempty" json:"priority,omitempty"`
}

// Attests reports whether the module's image gets a provenance
// attestation and an SBOM, where agents make them: unless the manifest
// turns them off.
func (b *Build) Attests() (provenance, sbom bool) {
	if b == nil {
		return false, false
	}
	return b.Provenance == nil || *b.Provenance, b.SBOM == nil || *b.SBOM
}

// Layer compressions a build may name (Build.Compression).
const (
	CompressionGzip = "gzip"
	CompressionZstd = "zstd"
)

// AskCompression is the compression the build ask carries for a
// manifest's build.compression: "" for gzip, the default (so that a
// module's input key is the same whether the manifest says gzip or
// nothing), else the compression.
func (b *Build) AskCompression() string {
	if b == nil || b.Compression == CompressionGzip {
		return ""
	}
	return b.Compression
}

// Seat is a role with a protocol: the verbs it accepts (a work queue), the
// events it emits and the tools it serves.
type Seat struct {
	Seat    string   `yaml:"seat" json:"seat"`
	Scope   string   `yaml:"scope,omitempty" json:"scope,omitempty"`
	Accepts []string `yaml:"accepts,omitempty" json:"accepts,omitempty"`
	Emits   []string `yaml:"emits,omitempty" json:"emits,omitempty"`
	Serves  []string `yaml:"serves,omitempty" json:"serves,omitempty"`
	// Shards splits the build seat's queue of each platform into this
	// many, each with its own holders' consumer, a machine pulling from one
	// (ShardOf): a consumer walks every pull waiting on it each time it runs
	// dry, so a fleet of many thousand machines wants several
	// (FleetSettingsOf's Shards). 0 or 1: one queue. Only the build seat.
	Shards int `yaml:"shards,omitempty" json:"shards,omitempty"`
}

// Bucket is a piece of state a module owns (ADR 0201).
type Bucket struct {
	Name    string `yaml:"name" json:"name"`
	History int    `yaml:"history,omitempty" json:"history,omitempty"`
	// TTL is how long a value lives: 0 (or empty) is forever; otherwise a
	// duration such as 90s, 12h or 7d.
	TTL string `yaml:"ttl,omitempty" json:"ttl,omitempty"`
}

// Scopes a seat may have.
const (
	ScopeMesh = "mesh"
	ScopeNode = "node"
)

// Accept is one parsed entry of a seat's accepts: a verb and how long its
// backlog survives.
type Accept struct {
	Verb   string
	Retain time.Duration
}

// DefaultRetain is how long an accepted verb's backlog survives when the
// manifest says nothing.
const DefaultRetain = 7 * 24 * time.Hour

// DefaultPlatform is a build's platform when the manifest names none.
const DefaultPlatform = "linux/amd64"

// DefaultDockerfile is a build's Dockerfile when the manifest names none.
const DefaultDockerfile = "Dockerfile"

// ControllerSeat is the mesh's own seat the controller holds: one holder in
// the mesh, so a second controller is a standby. Nodes enrol with it and
// report to it.
const ControllerSeat = "mesh-controller"

// MeshSeats are the mesh's own seats, declared by the mesh itself (ADR 0121):
// a module is assigned one with holds, and never declares one.
var MeshSeats = []Seat{
	{Seat: "mesh-git", Scope: ScopeMesh, Emits: []string{"pushed"}},
	{Seat: ControllerSeat, Scope: ScopeMesh, Accepts: []string{"report retain 7d", "enrol retain 7d"},
		Serves: []string{"nodes", "assign", "unassign", "seats"}},
}

// MeshSeat returns the mesh's own seat by name.
func MeshSeat(name string) (Seat, bool) {
	for _, s := range MeshSeats {
		if s.Seat == name {
			return s, true
		}
	}
	return Seat{}, false
}

// Platforms returns the build's platforms, defaulted.
func (b *Build) PlatformsOrDefault() []string {
	if b == nil || len(b.Platforms) == 0 {
		return []string{DefaultPlatform}
	}
	return b.Platforms
}

// DockerfileOrDefault returns the build's Dockerfile path relative to Path.
func (b *Build) DockerfileOrDefault() string {
	if b == nil || b.Dockerfile == "" {
		return DefaultDockerfile
	}
	return b.Dockerfile
}

// DockerfileOutside says where a build's Dockerfile is when it lies outside
// its build context: dockerfile (relative to contextPath, "" for
// DefaultDockerfile) climbs out of it with "..", as `docker build -f
// docker/app.Dockerfile app` reads one. dir is then the directory that
// holds it, relative to the repository's root ("" for the root), and
// outside true. Its directory is the build's Dockerfile mount (and the
// place of its .dockerignore), so the module's input key names that
// directory's tree beside its context's. A Dockerfile in its context
// returns "", false. Whether the path stays in the repository is the
// manifest check's to say (it refuses one that leaves it).
func DockerfileOutside(contextPath, dockerfile string) (dir string, outside bool) {
	if strings.TrimSpace(dockerfile) == "" {
		dockerfile = DefaultDockerfile
	}
	df := path.Clean(strings.TrimSpace(dockerfile))
	if df != ".." && !strings.HasPrefix(df, "../") {
		return "", false
	}
	ctx := strings.TrimPrefix(path.Clean("/"+strings.TrimSpace(contextPath)), "/")
	dir = path.Dir(path.Join(ctx, df))
	if dir == "." {
		dir = ""
	}
	return dir, true
}
