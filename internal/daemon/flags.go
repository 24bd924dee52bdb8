package daemon

import (
	"fmt"
	"os"
	"strings"
)

// Env returns the environment variable's value, or def.
func Env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// ParseInsteadOf parses URL=PATH pairs (git's url.<base>.insteadOf).
func ParseInsteadOf(pairs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range pairs {
		from, to, ok := strings.Cut(p, "=")
		if !ok || from == "" || to == "" {
			return nil, fmt.Errorf("--git-instead-of %q: write URL=PATH (e.g. https://git.example/fleet.git=/srv/git/fleet)", p)
		}
		out[from] = to
	}
	return out, nil
}

// SplitList splits a comma-separated flag value, dropping empty items.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// WindowUsage explains the controller's --window.
const WindowUsage = "how released asks are published: -1 (default) as many as holders are idle, longest remaining path first; " +
	"0 every ask the moment it is released (the most throughput); N at most N queued per plan"
