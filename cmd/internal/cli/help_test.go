package cli_test

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/meshbuild/meshbuild/cmd/internal/cli"
)

// Every flag in every command's --help shows its value's type, not a word
// of its usage: pflag takes a `backquoted` word of a usage string as the
// value's name (`--creds builds up --state` was shown so).
func TestHelpShowsNoUsageWordAsAValueName(t *testing.T) {
	root := cli.NewRoot(&bytes.Buffer{}, &bytes.Buffer{})
	args := [][]string{{"--help"}}
	for _, c := range root.Commands() {
		args = append(args, []string{c.Name(), "--help"})
	}
	for _, a := range args {
		var out, errw bytes.Buffer
		if code := cli.Main(context.Background(), a, &out, &errw); code != 0 {
			t.Fatalf("%s --help: exit %d: %s", a[0], code, errw.String())
		}
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "-") && strings.Contains(l, "`") {
				t.Errorf("%s --help: a backquote in %q", a[0], strings.TrimSpace(l))
			}
		}
		if m := regexp.MustCompile(`--creds (\S+)`).FindStringSubmatch(out.String()); m != nil && m[1] != "string" {
			t.Errorf("%s --help shows --creds %s, want --creds string", a[0], m[1])
		}
	}
}
