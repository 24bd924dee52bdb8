package daemon

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
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
const WindowUsage = "how released asks are published: -1 (default) as many as holders are idle, ranked across plans " +
	"(priority, fair share by owner, caps, superseded work) and longest remaining path first inside a plan; " +
	"0 every ask the moment it is released (the most throughput, first in first out: it cannot rank, so priorities, shares and caps do nothing); " +
	"N at most N queued per plan (nor can it rank across plans)"

// ParseOwnerValues parses repeated OWNER=VALUE flags (--share, --cap):
// the owner is everything before the last '=' (a repository URL may
// hold one), the value parsed by parse.
func ParseOwnerValues[V any](flag string, vals []string, parse func(string) (V, error)) (map[string]V, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := make(map[string]V, len(vals))
	for _, v := range vals {
		i := strings.LastIndexByte(v, '=')
		if i <= 0 {
			return nil, fmt.Errorf("--%s %q: want OWNER=VALUE, the owner a repository as plans name it (builds plans --json: owner)", flag, v)
		}
		x, err := parse(v[i+1:])
		if err != nil {
			return nil, fmt.Errorf("--%s %q: %w", flag, v, err)
		}
		out[v[:i]] = x
	}
	return out, nil
}

// NATSFlag adds --nats (MESHBUILD_NATS) to fs: the NATS server's URL, or
// a cluster's, comma separated.
func NATSFlag(fs *flag.FlagSet) *string {
	return fs.String("nats", Env("MESHBUILD_NATS", "nats://127.0.0.1:4222"), "NATS server URL(s), comma separated (MESHBUILD_NATS)")
}

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

// LogFlag is --log-level (MESHBUILD_LOG_LEVEL): the least severe lines a
// process writes. Debug adds the controller's turns, each step timed.
type LogFlag struct {
	level slog.Level
	set   bool
}

// LogLevelFlag adds --log-level to fs.
func LogLevelFlag(fs *flag.FlagSet) *LogFlag {
	l := &LogFlag{}
	fs.Func("log-level", "debug, info, warn or error: the least severe log lines written (default info; MESHBUILD_LOG_LEVEL)", func(v string) error {
		l.set = true
		var err error
		l.level, err = LevelOf(v)
		return err
	})
	return l
}

// Logger is a text logger on w at the level asked for: the flag's, else
// MESHBUILD_LOG_LEVEL's, else info. A level that is none of them is an
// error naming where it came from.
func (l *LogFlag) Logger(w io.Writer) (*slog.Logger, error) {
	lvl := l.level
	if !l.set {
		if v := Env("MESHBUILD_LOG_LEVEL", ""); v != "" {
			var err error
			if lvl, err = LevelOf(v); err != nil {
				return nil, fmt.Errorf("MESHBUILD_LOG_LEVEL: %w", err)
			}
		}
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl})), nil
}

// LevelOf is the log level named v (debug, info, warn or error, any case).
func LevelOf(v string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(v)); err != nil {
		return l, fmt.Errorf("%q is not a log level: write debug, info, warn or error", v)
	}
	return l, nil
}
