package mesh

import (
	"errors"
	"testing"
)

func TestDecodeEventChecksTheVersion(t *testing.T) {
	b, err := DecodeEvent[Built]([]byte(`{"version":1,"ask":"a-1","digest":"sha256:00"}`))
	if err != nil || b.Ask != "a-1" {
		t.Fatalf("built: %+v %v", b, err)
	}
	if _, err := DecodeEvent[Failed]([]byte(`{"version":2,"ask":"a-1"}`)); !errors.Is(err, ErrEventVersion) {
		t.Errorf("failed of version 2: %v, want ErrEventVersion", err)
	}
	if _, err := DecodeEvent[Pushed]([]byte(`{"repo":"r"}`)); !errors.Is(err, ErrEventVersion) {
		t.Errorf("pushed without a version: %v, want ErrEventVersion", err)
	}
	if _, err := DecodeEvent[Started]([]byte(`{not json`)); !errors.Is(err, ErrMalformedEvent) {
		t.Errorf("garbage: %v, want ErrMalformedEvent", err)
	}
}
