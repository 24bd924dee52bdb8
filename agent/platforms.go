package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/platforms"

	"github.com/meshbuild/meshbuild/mesh"
)

// Platforms are the platforms the daemon's workers build, normalised and
// sorted: the native one and every one it emulates (BuildKit lists those
// its binfmt handlers cover). Its error wraps ErrInfra.
func (b *BuildKit) Platforms(ctx context.Context) ([]string, error) {
	if err := b.Ping(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.DialTimeout)
	defer cancel()
	ws, err := b.c.ListWorkers(ctx)
	if err != nil {
		return nil, classified(ErrInfra, saying("listing the workers of buildkitd at "+b.addr, err), err)
	}
	var out []string
	for _, w := range ws {
		for _, p := range w.Platforms {
			out = append(out, platforms.Format(platforms.Normalize(p)))
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// ChoosePlatforms is the platforms an agent builds: every one its worker
// builds, or, when the operator named some (--platforms), those — each of
// which the worker must build. A platform the worker cannot build is refused
// with what it can, so that no ask is taken that would fail on this machine.
func ChoosePlatforms(worker, wanted []string) ([]string, error) {
	if len(worker) == 0 {
		return nil, fmt.Errorf("%w: the BuildKit worker lists no platforms", ErrConfig)
	}
	if len(wanted) == 0 {
		return slices.Clone(worker), nil
	}
	var out, cannot []string
	for _, p := range wanted {
		n, err := mesh.NormalizePlatform(p)
		if err != nil {
			return nil, fmt.Errorf("%w: --platforms: %v", ErrConfig, err)
		}
		if !slices.Contains(worker, n) {
			cannot = append(cannot, n)
			continue
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(cannot) > 0 {
		return nil, fmt.Errorf("%w: --platforms %s: this machine's BuildKit worker does not build it (it builds %s); drop it, or give the worker the platform (QEMU binfmt handlers for an emulated one)",
			ErrConfig, strings.Join(cannot, ", "), strings.Join(worker, ", "))
	}
	return out, nil
}
