package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// `builds creds init` advises an include line that nats-server reads as it
// is: nats-server resolves an include relative to the directory of the file
// that includes it — even a path starting with / — so the line is the key
// directory relative to the server's configuration (--server-conf), or to
// one in the current directory. The real server's parser reads each, and a
// server starts with it. Before, it advised "include /abs/keys/server.conf",
// which nats-server opens as <conf dir>/abs/keys/server.conf.
func TestCredsInitAdvisesAnIncludeTheServerReads(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	etc := filepath.Join(t.TempDir(), "etc", "nats")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	serverConf := filepath.Join(etc, "nats-server.conf")
	for _, tc := range []struct {
		name, keys, conf string
		args             []string
	}{
		{"for --server-conf", "keys", serverConf, []string{"--server-conf", serverConf}},
		{"for the current directory", "keys2", filepath.Join(work, "nats-server.conf"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(work)
			code, out, errw := run(t, append([]string{"creds", "init", tc.keys}, tc.args...)...)
			if code != 0 {
				t.Fatalf("creds init: exit %d\n%s\n%s", code, out, errw)
			}
			m := regexp.MustCompile(`(?m)^\s*(include \S+)$`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no include line to paste in:\n%s", out)
			}
			t.Logf("%s", m[1])
			store := filepath.Join(t.TempDir(), "js")
			if err := os.WriteFile(tc.conf, []byte("port: -1\njetstream {store_dir: \""+store+"\"}\n"+m[1]+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Chdir(t.TempDir()) // nats-server -c FILE, started anywhere
			opts, err := server.ProcessConfigFile(tc.conf)
			if err != nil {
				t.Fatalf("nats-server cannot read the advised %q: %v", m[1], err)
			}
			if len(opts.TrustedOperators) == 0 {
				t.Fatalf("the include %q gave no operator", m[1])
			}
			opts.NoLog, opts.NoSigs = true, true
			s, err := server.NewServer(opts)
			if err != nil {
				t.Fatalf("a server with the advised include: %v", err)
			}
			s.Shutdown()
		})
	}
}
