package cascade

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshbuild/meshbuild/internal/gitcache"
	"github.com/meshbuild/meshbuild/internal/testenv"
)

// A plan built on a changed base holds modules of several repositories,
// each at its current commit (HEAD, asked of its git server): address
// asks the servers at once, not one after the other. Every git server
// here takes a second to answer and logs when it begins and ends; a
// second server begins before the first ends.
func TestAddressAsksEachRepositoryAtOnce(t *testing.T) {
	log := filepath.Join(t.TempDir(), "upload-packs")
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "remote.origin.uploadpack")
	t.Setenv("GIT_CONFIG_VALUE_0", "echo begin >> "+log+"; sleep 1; echo end >> "+log+"; git-upload-pack")

	p := plan(t, "a:", "b:", "c:")
	insteadOf := map[string]string{}
	st := NewState(p, t0)
	for i := range st.Modules {
		m := &st.Modules[i]
		repo := "https://git.example/" + m.Module + ".git"
		dir, _ := testenv.GitRepo(t, map[string]string{"ctx/Dockerfile": "FROM scratch\nLABEL m=" + m.Module + "\n"})
		insteadOf[repo] = dir
		m.Source.Repo, m.Source.Commit, m.Source.Path = repo, "", "ctx"
	}
	c := &Controller{
		trees: &gitcache.Cache{Dir: t.TempDir(), InsteadOf: insteadOf},
		cfg:   Config{ResolveTimeout: time.Minute},
		log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	c.address(context.Background(), st)
	for _, m := range st.Modules {
		if m.Tree == "" || !gitcache.FullHash(m.Source.Commit) {
			t.Errorf("%s not addressed: tree %q, commit %q", m.Module, m.Tree, m.Source.Commit)
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(data))
	if len(lines) < 2*len(st.Modules) {
		t.Fatalf("the git servers logged %q, want a begin and an end for each of %d", lines, len(st.Modules))
	}
	if lines[0] != "begin" || lines[1] != "begin" {
		t.Errorf("the git servers were asked one after the other: %q", lines)
	}
}
