package cascade

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strconv"
)

// current finds the module an event is about, if the event names its
// current ask (and this plan).
func (s *State) current(plan, module, ask string) (int, bool) {
	s.ensure()
	if plan != "" && plan != s.Plan {
		return 0, false
	}
	i, ok := s.ix.pos[module]
	if !ok || ask == "" || s.Modules[i].Ask != ask {
		return 0, false
	}
	return i, true
}

// maxAskID is the longest ask id the build seat accepts.
const maxAskID = 128

var askIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// AskID derives the id of a module's ask in a plan: planID-module-attempt
// (e.g. "p-1a2b3c4d5e6f-runtime-1"). It is deterministic, so an ask
// re-published after a restart is deduplicated by the bus, and a retry (a
// new attempt) is a new ask. It has no dots and is 1-128 of [A-Za-z0-9_-];
// an id that would not be (an over-long module name) is cut and suffixed
// with a hash of the whole.
func AskID(planID, module string, attempt int) string {
	id := planID + "-" + module + "-" + strconv.Itoa(attempt)
	if askIDRE.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	suffix := "-" + hex.EncodeToString(sum[:8])
	b := []byte(id)
	for k, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[k] = '_'
		}
	}
	if len(b) > maxAskID-len(suffix) {
		b = b[:maxAskID-len(suffix)]
	}
	return string(b) + suffix
}
