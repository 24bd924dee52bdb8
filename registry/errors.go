package registry

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/distribution/distribution/v3/registry/api/errcode"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// IsInfra reports whether err is a registry failure of infrastructure: the
// registry could not be reached (refused, reset, unresolvable, timed out)
// or answered 5xx, 408 Request Timeout or 429 Too Many Requests. Such a
// failure may pass; the same request is worth retrying later.
func IsInfra(err error) bool {
	if err == nil {
		return false
	}
	if code, ok := Status(err); ok {
		return InfraStatus(code)
	}
	return Unreachable(err)
}

// InfraStatus reports whether a registry's HTTP answer is one that may
// pass: 5xx, 408 Request Timeout, 429 Too Many Requests.
func InfraStatus(code int) bool {
	return code >= 500 || code == http.StatusRequestTimeout || code == http.StatusTooManyRequests
}

// Unreachable reports whether err is a registry (or any peer) that could not
// be reached or did not answer in time: refused, reset, unresolvable,
// unroutable, cut off mid-answer, timed out. It reads Go's network errors,
// and their words where they only arrive as text (BuildKit passes a
// registry's failure along as its message).
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var (
		oe  *net.OpError
		dns *net.DNSError
		ne  net.Error
	)
	switch {
	case errors.As(err, &oe), errors.As(err, &dns):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH):
		return true
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return true
	case errors.Is(err, context.DeadlineExceeded):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	}
	text := err.Error()
	for _, w := range unreachableWords {
		if strings.Contains(text, w) {
			return true
		}
	}
	return false
}

// unreachableWords are Go's and the kernel's words for a peer that cannot
// be reached, as they read in an error that crossed the wire as text.
var unreachableWords = []string{
	"connection refused", "connection reset by peer", "broken pipe", "no such host",
	"no route to host", "network is unreachable", "i/o timeout", "TLS handshake timeout",
	"context deadline exceeded", "unexpected EOF", "server misbehaving",
}

// IsRejected reports whether err is the registry's refusal of a request:
// a 4xx answer other than 408 and 429 (unauthorized, denied, unknown name
// or manifest, invalid manifest). The same request will be refused again.
func IsRejected(err error) bool {
	code, ok := Status(err)
	return ok && code >= 400 && code < 500 && !InfraStatus(code)
}

// IsNotFound reports whether err is the registry's answer that a repository,
// manifest or blob does not exist (404).
func IsNotFound(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusNotFound
}

// statusRE finds a registry's HTTP answer in the text of an error that
// crossed the wire as text: containerd's remotes, which BuildKit pushes
// and pulls with, write "unexpected status from PUT request to URL: 500
// Internal Server Error", or "unexpected status code URL: 503 Service
// Unavailable"; go-containerregistry writes "unexpected status code 429
// Too Many Requests".
var statusRE = regexp.MustCompile(`unexpected status(?: code)?(?: from [A-Z]+ request to)?(?: \S+:)? ([1-5][0-9]{2})\b`)

// Status is the HTTP status a registry answered with, as err carries it: a
// go-containerregistry *transport.Error, or the words containerd's
// remotes (BuildKit's push and pull) put it in. ok is false when err
// carries no answer (the registry was not reached, or the failure is not
// the registry's).
func Status(err error) (code int, ok bool) {
	if err == nil {
		return 0, false
	}
	var te *transport.Error
	if errors.As(err, &te) {
		return te.StatusCode, true
	}
	m := statusRE.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, false
	}
	code, _ = strconv.Atoi(m[1])
	return code, true
}

// Said is a registry's error code found in the words of an error:
// distribution's code (its Value, "BLOB_UPLOAD_UNKNOWN") and the HTTP
// status the registry answers it with.
type Said struct {
	Code   string
	Status int
}

// saidWords are distribution's error codes (the OCI distribution spec's,
// and the registry's own), each with the words they are written in: the
// code's message ("blob upload unknown to registry") and the code as
// containerd writes it ("blob upload unknown", "toomanyrequests"); the
// longest words first, so that the most specific code is found.
var saidWords = func() []struct {
	words string
	said  Said
} {
	var out []struct {
		words string
		said  Said
	}
	for _, d := range errcode.GetErrorAllDescriptors() {
		s := Said{Code: d.Value, Status: d.HTTPStatusCode}
		out = append(out, struct {
			words string
			said  Said
		}{strings.ToLower(d.Message), s})
		if d.Value != "UNKNOWN" { // containerd's word for every code it does not know
			out = append(out, struct {
				words string
				said  Said
			}{strings.ToLower(strings.ReplaceAll(d.Value, "_", " ")), s})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i].words) > len(out[j].words) })
	return out
}()

// SaidIn finds the registry's error code in text, the words of a failed
// push as BuildKit passes them along ("failed to push r/app: unknown:
// manifest invalid - …", "failed to push r/app: toomanyrequests"), which
// carry the registry's code and message but not its status. ok is false
// when text holds none.
func SaidIn(text string) (Said, bool) {
	lower := strings.ToLower(text)
	for _, w := range saidWords {
		if i := strings.Index(lower, w.words); i >= 0 && wordAt(lower, i, len(w.words)) {
			return w.said, true
		}
	}
	return Said{}, false
}

// wordAt reports whether text[i:i+n] stands as words of its own.
func wordAt(text string, i, n int) bool {
	letter := func(b byte) bool { return b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '_' }
	return (i == 0 || !letter(text[i-1])) && (i+n == len(text) || !letter(text[i+n]))
}
