package agent

import (
	"bytes"
	"fmt"
	"path"
	"strings"

	"github.com/distribution/reference"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// # Provenance and SBOM
//
// BuildKit makes both itself, as frontend options: attest:provenance
// (mode=max: the frontend's parameters — the Dockerfile, the build args,
// every named context — and every material pinned by digest, each base
// among them) and attest:sbom (an SPDX document made by a generator,
// itself an image). The agent adds what only the farm knows as the
// frontend's vcs attributes: the repository (vcs:source), the commit
// (vcs:revision) and where in it the build context and the Dockerfile are
// (vcs:localdir:context, vcs:localdir:dockerfile), which the provenance
// records in its BuildKit metadata.
//
// With attestations the image is pushed as an index of two manifests: the
// image's, and an attestation manifest (annotated
// vnd.docker.reference.type=attestation-manifest and
// vnd.docker.reference.digest=<the image>) whose layers are in-toto
// statements, each annotated with its predicate type.
//
// The image's digest stays the image manifest's, not the index's: the
// image is reproducible (SOURCE_DATE_EPOCH, timestamps rewritten), so input
// keys and early cutoff hold; the provenance is not — BuildKit v0.26
// records the build's start and finish times and its invocation id
// unclamped by SOURCE_DATE_EPOCH — so the index differs from build to
// build. The index, the attestation manifest and each statement are
// reported by digest (mesh.Attestations) beside the image's.

// Attestation annotations and predicate types, as BuildKit writes them
// (util/attestation, exporter/containerimage/writer.go).
const (
	annotationReferenceType   = "vnd.docker.reference.type"
	annotationReferenceDigest = "vnd.docker.reference.digest"
	referenceTypeAttestation  = "attestation-manifest"
	annotationPredicateType   = "in-toto.io/predicate-type"
	// ProvenanceMax is BuildKit's most detailed provenance.
	ProvenanceMax = "max"
	// ProvenanceOff attaches no provenance.
	ProvenanceOff = "off"
)

// isProvenance and isSBOM recognise a statement's predicate type: SLSA
// provenance (v0.2 or v1) and SPDX.
func isProvenance(t string) bool { return strings.HasPrefix(t, "https://slsa.dev/provenance/") }
func isSBOM(t string) bool       { return strings.HasPrefix(t, "https://spdx.dev/Document") }

// attestAttrs are the frontend attributes asking for req's attestations,
// and what the build log says of them.
func (b *BuildKit) attestAttrs(req BuildRequest) (attrs map[string]string, notes []string) {
	attrs = map[string]string{}
	switch {
	case req.Source.NoProvenance:
		notes = append(notes, "provenance: off for this module (build.provenance: false)")
	case b.opts.Provenance == ProvenanceOff:
		notes = append(notes, "provenance: off on this machine")
	default:
		attrs["attest:provenance"] = "mode=" + b.opts.Provenance
		attrs["vcs:source"] = req.Source.Repo
		attrs["vcs:revision"] = req.Source.Commit
		df := req.Source.Dockerfile
		if df == "" {
			df = "Dockerfile"
		}
		ctxPath := path.Clean("/" + req.Source.Path)[1:]
		attrs["vcs:localdir:context"] = orDot(ctxPath)
		attrs["vcs:localdir:dockerfile"] = orDot(path.Dir(path.Join(ctxPath, df)))
	}
	switch {
	case req.Source.NoSBOM:
		notes = append(notes, "sbom: off for this module (build.sbom: false)")
	case b.opts.SBOMGenerator == "":
		notes = append(notes, "sbom: off: this machine has no SBOM generator (set --sbom-generator to a generator image in the mesh's registry)")
	default:
		attrs["attest:sbom"] = "generator=" + b.opts.SBOMGenerator
	}
	return attrs, notes
}

func orDot(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// imageIn picks the image out of what was pushed as dgst: for an index of
// an image and its attestation manifest, the image manifest (the one of
// platform, or the only image) and the attestation manifest's descriptor
// (nil if the index has none for it); for an image, the image itself and no
// index (idx false).
func imageIn(desc *remote.Descriptor, platform string) (image v1.Descriptor, att *v1.Descriptor, idx bool, err error) {
	if !desc.MediaType.IsIndex() {
		return desc.Descriptor, nil, false, nil
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		return v1.Descriptor{}, nil, true, fmt.Errorf("reading index %s: %w", desc.Digest, err)
	}
	var images []v1.Descriptor
	attests := map[string]v1.Descriptor{} // by the image they attest
	for _, m := range im.Manifests {
		if m.Annotations[annotationReferenceType] == referenceTypeAttestation {
			attests[m.Annotations[annotationReferenceDigest]] = m
			continue
		}
		images = append(images, m)
	}
	for _, m := range images {
		if len(images) == 1 || platform != "" && m.Platform != nil && platformString(m.Platform) == platform {
			if a, ok := attests[m.Digest.String()]; ok {
				return m, &a, true, nil
			}
			return m, nil, true, nil
		}
	}
	return v1.Descriptor{}, nil, true, fmt.Errorf("index %s holds no image for %s (%d images)", desc.Digest, platform, len(images))
}

// statements returns the digests of the provenance and SBOM statements in
// the attestation manifest raw.
func statements(raw []byte) (provenance, sbom string, err error) {
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return "", "", fmt.Errorf("reading the attestation manifest: %w", err)
	}
	for _, l := range m.Layers {
		switch t := l.Annotations[annotationPredicateType]; {
		case isProvenance(t) && provenance == "":
			provenance = l.Digest.String()
		case isSBOM(t) && sbom == "":
			sbom = l.Digest.String()
		}
	}
	return provenance, sbom, nil
}

// platformString is os/arch[/variant].
func platformString(p *v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// validImageRef reports whether ref names an image (by tag or digest).
func validImageRef(ref string) bool {
	_, err := reference.ParseNormalizedNamed(ref)
	return err == nil
}
