package mesh

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/platforms"
)

// A platform is os/arch or os/arch/variant, as OCI and BuildKit spell it
// ("linux/amd64", "linux/arm64", "linux/arm/v7"). The build seat splits by
// platform: each platform has its own subject under the seat's accept verb
// and its own holders' consumer, so a machine only ever receives asks it can
// build. A platform is normalised first (containerd's rules: "linux/arm64/v8"
// is "linux/arm64", "linux/arm" is "linux/arm/v7"), so the catalogue, the
// ask and a BuildKit worker name one platform one way.

// NormalizePlatform returns a platform in its one spelling; an error names
// what is wrong with one that is not os/arch[/variant].
func NormalizePlatform(p string) (string, error) {
	if strings.Count(p, "/") < 1 || strings.Count(p, "/") > 2 {
		return "", fmt.Errorf("platform %q: want os/arch or os/arch/variant, such as %s or linux/arm/v7", p, DefaultPlatform)
	}
	spec, err := platforms.Parse(p)
	if err != nil {
		return "", fmt.Errorf("platform %q: %w", p, err)
	}
	return platforms.Format(platforms.Normalize(spec)), nil
}

// normalPlatform is NormalizePlatform for a platform already checked (the
// catalogue's, an ask's): one that does not parse is kept as written.
func normalPlatform(p string) string {
	if n, err := NormalizePlatform(p); err == nil {
		return n
	}
	return p
}

// PlatformToken is a platform as one subject token and a name part: its
// normal spelling with "/" as "-" ("linux/arm64" → "linux-arm64",
// "linux/arm/v7" → "linux-arm-v7"). Every subject and consumer name of a
// platform is derived through it.
func PlatformToken(platform string) string {
	return strings.ReplaceAll(normalPlatform(platform), "/", "-")
}

// SplitsByPlatform reports whether a seat's work splits by platform: one
// subject and one holders' consumer per platform. Only the build seat does.
func SplitsByPlatform(seat string) bool { return seat == BuildSeat }

// SeatPlatformSubject is where work asking seat s to do verb v for a
// platform is published: under the verb, one token for the platform
// (mesh.seat.node-build-agent.accept.build.linux-arm64).
func SeatPlatformSubject(seat, verb, platform string) string {
	return SeatAcceptSubject(seat, verb) + "." + PlatformToken(platform)
}

// SeatPlatformAll is every platform subject of seat s's verb v: what a
// holders' consumer of one platform filters from is one of these.
func SeatPlatformAll(seat, verb string) string {
	return SeatAcceptSubject(seat, verb+".*")
}

// SeatPlatformConsumer is the name of the one durable pull consumer every
// holder of seat s that builds a platform shares (holders-node-build-agent-
// linux-arm64).
func SeatPlatformConsumer(seat, platform string) string {
	return SeatConsumer(seat) + "-" + PlatformToken(platform)
}

// BuildSubject is where the build ask for a platform is published.
func BuildSubject(platform string) string {
	return SeatPlatformSubject(BuildSeat, BuildVerb, platform)
}

// BuildConsumerSpec is the build seat's holders' consumer of platform, as
// Raise asserts it for a build seat that accepts BuildVerb.
func BuildConsumerSpec(platform string, replicas int) ConsumerSpec {
	return SeatConsumerSpecs(Seat{Seat: BuildSeat, Accepts: []string{BuildVerb}}, []string{platform}, replicas)[0]
}

// BuildConsumer is the build seat's holders' consumer of a platform.
func BuildConsumer(platform string) string { return SeatPlatformConsumer(BuildSeat, platform) }

// Platforms are the platforms the catalogue's modules are built for,
// normalised, sorted, each once, and the default platform always (so that a
// holder of it has a queue to bind before any module asks for it): the build
// seat has one subject and one holders' consumer for each.
func (c *Catalogue) Platforms() []string {
	out := []string{DefaultPlatform}
	for _, m := range c.Modules {
		if m.Build == nil {
			continue
		}
		for _, p := range m.Build.PlatformsOrDefault() {
			out = append(out, normalPlatform(p))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
