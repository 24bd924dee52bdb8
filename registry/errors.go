package registry

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"

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
	var te *transport.Error
	if errors.As(err, &te) {
		return te.StatusCode >= 500 || te.StatusCode == http.StatusRequestTimeout ||
			te.StatusCode == http.StatusTooManyRequests
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
	return false
}

// IsRejected reports whether err is the registry's refusal of a request:
// a 4xx answer other than 408 and 429 (unauthorized, denied, unknown name
// or manifest, invalid manifest). The same request will be refused again.
func IsRejected(err error) bool {
	var te *transport.Error
	if !errors.As(err, &te) {
		return false
	}
	return te.StatusCode >= 400 && te.StatusCode < 500 &&
		te.StatusCode != http.StatusRequestTimeout && te.StatusCode != http.StatusTooManyRequests
}

// IsNotFound reports whether err is the registry's answer that a repository,
// manifest or blob does not exist (404).
func IsNotFound(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusNotFound
}
