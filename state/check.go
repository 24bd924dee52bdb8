package state

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/meshbuild/meshbuild/mesh"
)

// credentialWords are what a field name says when it names a credential,
// compared with the name lowercased and stripped of separators ("API_KEY",
// "api-key" and "apiKey" are all "apikey").
var credentialWords = []string{
	"password", "passwd", "passphrase", "secret", "token", "apikey", "privatekey",
	"accesskey", "secretkey", "signingkey", "credential", "authorization", "bearer", "cookie",
}

// credentialNames are whole names that say credential and are too short to
// look for inside longer names.
var credentialNames = []string{"pwd", "auth", "creds", "jwt", "nkey"}

// IsCredentialName reports whether a field name says it is a credential, in
// any case or separator.
func IsCredentialName(name string) bool {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		}
	}
	n := b.String()
	for _, w := range credentialNames {
		if n == w {
			return true
		}
	}
	for _, w := range credentialWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// CheckValue refuses a value the mesh does not store: one over
// mesh.BucketMaxValue, or a JSON value with a credential-named field at any
// depth (the error names its path). A value that is not JSON is checked for
// size only: sealed values cannot be recognised (ADR 0201).
func CheckValue(value []byte) error {
	if err := CheckSize(value); err != nil {
		return err
	}
	var v any
	if !json.Valid(value) || json.Unmarshal(value, &v) != nil {
		return nil
	}
	if path, ok := credentialField(v, ""); ok {
		return fmt.Errorf("%w: field %s names a credential: no secret is stored in a bucket (ADR 0201); store the secret's name and fetch the secret on request",
			ErrCredential, path)
	}
	return nil
}

// CheckSize refuses a value over mesh.BucketMaxValue, naming the limit: the
// check every writer of a mesh bucket makes, the mesh's own stores included.
func CheckSize(value []byte) error {
	if len(value) > mesh.BucketMaxValue {
		return fmt.Errorf("%w: %d bytes is over the limit of %s a value (ADR 0201): keep one record per key, or split it over keys",
			ErrValueTooLarge, len(value), size(mesh.BucketMaxValue))
	}
	return nil
}

// credentialField finds the first credential-named field in v, in a stable
// order, and returns its path ("db.password", "items[2].apiKey").
func credentialField(v any, at string) (string, bool) {
	switch t := v.(type) {
	case map[string]any:
		names := make([]string, 0, len(t))
		for k := range t {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			path := k
			if at != "" {
				path = at + "." + k
			}
			if IsCredentialName(k) {
				return path, true
			}
			if p, ok := credentialField(t[k], path); ok {
				return p, true
			}
		}
	case []any:
		for i, e := range t {
			if p, ok := credentialField(e, at+"["+strconv.Itoa(i)+"]"); ok {
				return p, true
			}
		}
	}
	return "", false
}

// size prints a byte count in KiB or MiB.
func size(n int) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return strconv.Itoa(n>>20) + " MiB"
	}
	return strconv.Itoa(n>>10) + " KiB"
}
