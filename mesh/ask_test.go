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

// An ask's compression is gzip (empty, or spelt out) or zstd; another is refused as
// malformed, naming the field, not built with BuildKit's default.
func TestAnAsksCompressionIsOneAgentsMake(t *testing.T) {
	ask := Ask{Version: AskVersion, ID: "p-app-1", Plan: "p", Module: "app", Image: "reg/app",
		Source: Source{Repo: "https://git.example/a.git", Commit: strings.Repeat("c", 40)}}
	for c, ok := range map[string]bool{"": true, CompressionZstd: true, CompressionGzip: true, "estargz": false, "uncompressed": false} {
		a := ask
		a.Source.Compression = c
		data, _ := json.Marshal(a)
		_, err := DecodeAsk(data)
		switch {
		case ok && err != nil:
			t.Errorf("compression %q: %v", c, err)
		case !ok && (!errors.Is(err, ErrMalformedAsk) || !strings.Contains(err.Error(), "source.compression")):
			t.Errorf("compression %q: %v, want a malformed ask naming source.compression", c, err)
		}
	}
}

// An ask's proof of delivery holds for the machine, the ask and the secret
// it was made with, and for no other; an ask with no secret has none.
func TestAnAskProofHoldsForItsMachineAndAskOnly(t *testing.T) {
	p := AskProof("s3cret", "p-1-base-1", "m1")
	if !ValidAskProof(p, "s3cret", "p-1-base-1", "m1") {
		t.Fatal("a proof does not hold for what it was made for")
	}
	for _, c := range []struct{ secret, id, machine string }{
		{"s3cret", "p-1-base-1", "m2"}, {"s3cret", "p-1-base-2", "m1"}, {"other", "p-1-base-1", "m1"},
		// the id and the machine are kept apart
		{"s3cret", "p-1-base-1m", "1"},
	} {
		if ValidAskProof(p, c.secret, c.id, c.machine) {
			t.Errorf("m1's proof of p-1-base-1 holds for %+v", c)
		}
	}
	if AskProof("", "p-1-base-1", "m1") != "" || ValidAskProof("", "", "p-1-base-1", "m1") {
		t.Error("an ask with no secret has a proof")
	}
}
