// Package buildx pins docker/buildx as a tool (see go.mod), in a module of
// its own: buildx needs versions of docker/cli and go-containerregistry
// other than meshbuild's, so it is not a tool of the main module.
// scripts/install-deps.sh builds bin/buildx from here; the tests run
// `buildx imagetools inspect` with it, as a user of the farm would.
package buildx
