package daemon

import (
	"flag"
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

// TLSFlags adds --tls-ca, --tls-cert and --tls-key (MESHBUILD_TLS_CA,
// MESHBUILD_TLS_CERT, MESHBUILD_TLS_KEY) to fs: how to reach a NATS server
// that speaks TLS.
func TLSFlags(fs *flag.FlagSet) *TLS {
	t := &TLS{}
	fs.StringVar(&t.CA, "tls-ca", Env("MESHBUILD_TLS_CA", ""), "CA certificate (PEM) that signed the NATS server's, for a TLS server (MESHBUILD_TLS_CA)")
	fs.StringVar(&t.Cert, "tls-cert", Env("MESHBUILD_TLS_CERT", ""), "client certificate (PEM), for a NATS server that verifies clients; with --tls-key (MESHBUILD_TLS_CERT)")
	fs.StringVar(&t.Key, "tls-key", Env("MESHBUILD_TLS_KEY", ""), "the client certificate's key (PEM) (MESHBUILD_TLS_KEY)")
	return t
}
