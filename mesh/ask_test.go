package mesh

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// An ask's source tree, when given, is a git object name; anything else is
// refused as malformed, naming the field.
func TestAnAsksTreeIsAnObjectName(t *testing.T) {
	ask := Ask{Version: AskVersion, ID: "p-app-1", Plan: "p", Module: "app", Image: "reg/app",
		Source: Source{Repo: "https://git.example/a.git", Commit: strings.Repeat("c", 40)}}
	for tree, ok := range map[string]bool{
		"":                      true,
		strings.Repeat("a", 40): true,
		strings.Repeat("b", 64): true,
		"HEAD":                  false,
		strings.Repeat("A", 40): false,
		strings.Repeat("a", 39): false,
		"--output=/etc/passwd":  false,
	} {
		a := ask
		a.Source.Tree = tree
		data, _ := json.Marshal(a)
		_, err := DecodeAsk(data)
		switch {
		case ok && err != nil:
			t.Errorf("tree %q: %v", tree, err)
		case !ok && (!errors.Is(err, ErrMalformedAsk) || !strings.Contains(err.Error(), "source.tree")):
			t.Errorf("tree %q: %v, want a malformed ask naming source.tree", tree, err)
		}
	}
}
