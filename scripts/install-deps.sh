#!/usr/bin/env bash
# install-deps.sh installs what meshbuild's tests and `builds up` need on a
# Debian machine: runc, busybox-static, git and prometheus from apt, and
# bin/buildkitd and bin/buildctl built from the buildkit module pinned in
# go.mod. It is idempotent and silent when everything is present; it runs
# `apt-get update` only when a package is missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

die() { echo "install-deps: $*" >&2; exit 1; }

# Debian packages, named by the command each provides.
# docker-registry is Debian's distribution 2.8: a registry without the OCI
# referrers API, on which the referrers tag schema is tested.
declare -A pkgs=([runc]=runc [busybox]=busybox-static [git]=git [prometheus]=prometheus [docker-registry]=docker-registry)
missing=()
for cmd in runc busybox git prometheus docker-registry; do
	if ! command -v "$cmd" >/dev/null 2>&1; then
		missing+=("${pkgs[$cmd]}")
	fi
done
# busybox must be the static build: it is copied into a scratch image.
if command -v busybox >/dev/null 2>&1 && ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed'; then
	[[ " ${missing[*]} " == *" busybox-static "* ]] || missing+=(busybox-static)
fi

if ((${#missing[@]})); then
	echo "install-deps: installing ${missing[*]}" >&2
	command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install ${missing[*]} by hand"
	sudo=""
	if [[ $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null 2>&1 || die "not root and no sudo; install ${missing[*]} as root"
		sudo="sudo"
	fi
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -qq >/dev/null || die "apt-get update failed"
	$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
		|| die "apt-get install ${missing[*]} failed"
	for cmd in runc busybox git prometheus docker-registry; do
		command -v "$cmd" >/dev/null 2>&1 || die "$cmd still missing after apt-get install"
	done
fi

command -v go >/dev/null 2>&1 || die "go not found in PATH"

# bin/buildkitd and bin/buildctl: rebuilt when missing or when the buildkit
# version pinned in go.mod changes (recorded in bin/.buildkit-version).
want="$(go list -m -f '{{.Version}}' github.com/moby/buildkit)" || die "go list of the buildkit module failed"
have="$(cat bin/.buildkit-version 2>/dev/null || true)"
build=0
for b in bin/buildkitd bin/buildctl; do
	[[ -x $b ]] || build=1
done
[[ $want == "$have" ]] || build=1
if ((build)); then
	echo "install-deps: building bin/buildkitd and bin/buildctl (buildkit $want)" >&2
	mkdir -p bin
	go build -o bin/ github.com/moby/buildkit/cmd/buildkitd github.com/moby/buildkit/cmd/buildctl \
		|| die "go build of buildkitd and buildctl failed"
	echo "$want" > bin/.buildkit-version
fi

# bin/buildx: docker/buildx pinned as a tool in tools/buildx/go.mod (a module
# of its own: its docker/cli is not meshbuild's); the attestation tests read
# what the farm pushed with `buildx imagetools inspect`, as users do.
bxwant="$(cd tools/buildx && go list -m -f '{{.Version}}' github.com/docker/buildx)" || die "go list of the buildx module failed"
if [[ ! -x bin/buildx || $bxwant != "$(cat bin/.buildx-version 2>/dev/null || true)" ]]; then
	echo "install-deps: building bin/buildx (buildx $bxwant)" >&2
	mkdir -p bin
	(cd tools/buildx && go build -ldflags "-X github.com/docker/buildx/version.Version=$bxwant" -o ../../bin/buildx github.com/docker/buildx/cmd/buildx) \
		|| die "go build of buildx failed"
	echo "$bxwant" > bin/.buildx-version
fi

# The OCI distribution-spec conformance tool that registry's TestConformance
# builds: its module and dependencies into the Go module cache (the test
# builds the binary into a temp dir; it is not in go.mod). The version is the
# test's.
conf="$(grep -o 'github.com/opencontainers/distribution-spec/conformance@v[^"]*' registry/conformance_test.go)" \
	|| die "no conformance module version in registry/conformance_test.go"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
confdir="$(cd "$tmp" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$conf" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -n $confdir ]] || die "go mod download $conf failed"
(cd "$confdir" && GOWORK=off GOFLAGS=-mod=mod go mod download) || die "go mod download of $conf's dependencies failed"
