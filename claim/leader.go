package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/meshbuild/meshbuild/mesh"
)

// A key-value read (jetstream.KeyValue.Get) is a direct get, which any
// replica of the bucket may answer — on a cluster, one that has not caught
// up yet answers that a key written moments ago is not there (a server just
// back after a loss of quorum can lag seconds). A claim that is not found is
// therefore asked of the bucket's stream leader, which answers with what is
// committed: a claim is only taken for gone when the leader says so.

// readLeader reads the last value of key in bucket from the bucket's stream
// leader. It returns jetstream.ErrKeyNotFound when the key was never written
// (or is gone), jetstream.ErrKeyDeleted when its last entry is a delete, a
// purge or the server's marker of a lapsed TTL.
func readLeader(ctx context.Context, js jetstream.JetStream, bucket, key string) ([]byte, error) {
	req, _ := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{mesh.KVKeySubject(bucket, key)})
	msg, err := js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+mesh.KVStream(bucket), req)
	if err != nil {
		return nil, fmt.Errorf("asking the leader of %s for %s: %w", bucket, key, err)
	}
	var resp struct {
		Message *struct {
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Code        int                 `json:"code"`
			ErrCode     jetstream.ErrorCode `json:"err_code"`
			Description string              `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("asking the leader of %s for %s: %w", bucket, key, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrKeyNotFound
	case resp.Error != nil:
		return nil, fmt.Errorf("asking the leader of %s for %s: %s (%d)", bucket, key, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, fmt.Errorf("asking the leader of %s for %s: an empty answer", bucket, key)
	}
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return nil, fmt.Errorf("asking the leader of %s for %s: %w", bucket, key, err)
		}
		if removed(h) {
			return nil, jetstream.ErrKeyDeleted
		}
	}
	return resp.Message.Data, nil
}

// gone reports whether err says a key is not there.
func gone(err error) bool {
	return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted)
}

// removed reports whether a key-value message's headers h say its key was
// deleted, purged or lapsed (the server's marker) rather than written.
func removed(h nats.Header) bool {
	return h.Get(kvOperation) != "" || h.Get(jetstream.MarkerReasonHeader) != ""
}
