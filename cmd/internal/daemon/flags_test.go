package daemon

import (
	"bytes"
	"context"
	"flag"
	"log/slog"
	"strings"
	"testing"
)

func TestLogLevelFlag(t *testing.T) {
	cases := []struct {
		name, env string
		args      []string
		debug     bool   // a debug line is written
		info      bool   // an info line is written
		err       string // Logger's error, if any
		parseErr  string // the flag's, if any
	}{
		{name: "default", info: true},
		{name: "flag debug", args: []string{"--log-level", "debug"}, debug: true, info: true},
		{name: "env debug", env: "DEBUG", debug: true, info: true},
		{name: "flag beats env", env: "debug", args: []string{"--log-level=warn"}},
		{name: "flag beats a bad env", env: "loud", args: []string{"--log-level=info"}, info: true},
		{name: "bad env", env: "loud", err: `MESHBUILD_LOG_LEVEL: "loud" is not a log level: write debug, info, warn or error`},
		{name: "bad flag", args: []string{"--log-level", "chatty"}, parseErr: `"chatty" is not a log level`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("MESHBUILD_LOG_LEVEL", c.env)
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.SetOutput(new(bytes.Buffer))
			l := LogLevelFlag(fs)
			err := fs.Parse(c.args)
			if c.parseErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.parseErr) {
					t.Fatalf("parse: %v, want %q", err, c.parseErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			log, err := l.Logger(&out)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("Logger: %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			log.Debug("a debug line")
			log.Info("an info line")
			if got := strings.Contains(out.String(), "a debug line"); got != c.debug {
				t.Errorf("debug line written: %v, want %v:\n%s", got, c.debug, out.String())
			}
			if got := strings.Contains(out.String(), "an info line"); got != c.info {
				t.Errorf("info line written: %v, want %v:\n%s", got, c.info, out.String())
			}
			if !log.Enabled(context.Background(), slog.LevelError) {
				t.Error("error lines are not written")
			}
		})
	}
}
