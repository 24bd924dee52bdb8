package testenv

import (
	"log/slog"
	"strings"
	"testing"
)

// Log is a debug-level logger writing through tb.Log, so that a failing
// test (or one run with -v) shows what the parts it started did. Whatever
// logs through it must stop before the test ends (stop it in a Cleanup).
func Log(tb testing.TB, name string) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("part", name)
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
