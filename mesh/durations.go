package mesh

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseRetain parses a retention or TTL duration: Go's durations (90s, 12h)
// plus days (7d) and weeks (2w). "0" is zero.
func ParseRetain(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	for suffix, unit := range map[string]time.Duration{"d": 24 * time.Hour, "w": 7 * 24 * time.Hour} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			v, err := strconv.ParseUint(n, 10, 32)
			if err != nil {
				return 0, fmt.Errorf("%q is not a duration: write e.g. 7d, 12h or 90m", s)
			}
			return time.Duration(v) * unit, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration: write e.g. 7d, 12h or 90m", s)
	}
	return d, nil
}

// ParseTTL parses a bucket's ttl: "" and "0" are forever.
func ParseTTL(s string) (time.Duration, error) {
	if strings.TrimSpace(s) == "" {
		return 0, nil
	}
	return ParseRetain(s)
}

// ParseAccept parses one accepts entry, "VERB" or "VERB retain DURATION".
func ParseAccept(s string) (Accept, error) {
	f := strings.Fields(s)
	switch {
	case len(f) == 1:
		return Accept{Verb: f[0], Retain: DefaultRetain}, nil
	case len(f) == 3 && f[1] == "retain":
		d, err := ParseRetain(f[2])
		if err != nil {
			return Accept{}, err
		}
		if d == 0 {
			return Accept{}, fmt.Errorf("retain 0 would drop every ask: write e.g. %s retain 7d", f[0])
		}
		return Accept{Verb: f[0], Retain: d}, nil
	default:
		return Accept{}, fmt.Errorf("%q: write VERB or VERB retain DURATION (e.g. build retain 7d)", s)
	}
}
