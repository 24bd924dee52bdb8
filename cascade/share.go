package cascade

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// keyShare is the prefix of the owners' recent machine-time in the plans
// bucket: share.<hash of the owner> holds a Share (the owner in it), so
// that a restarted controller shares machines as the stopped one did.
const keyShare = "share."

// ShareKey is the key an owner's Share is kept under: owners are
// repository URLs, which a key cannot spell, so it is named by a hash.
func ShareKey(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return keyShare + hex.EncodeToString(sum[:8])
}

// Shares returns every owner's recent machine-time, by owner.
func (s *Store) Shares(ctx context.Context) (map[string]Share, error) {
	out := map[string]Share{}
	err := s.each(ctx, keyShare+"*", func(key string, data []byte) error {
		var sh Share
		if err := json.Unmarshal(data, &sh); err != nil {
			return fmt.Errorf("decoding %s: %w", key, err)
		}
		out[sh.Owner] = sh
		return nil
	})
	return out, err
}
