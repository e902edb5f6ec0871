package logredact

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// TestRedactHandler: once a Redactor is set, the message, string, error and
// grouped attributes, and attributes given to WithAttrs, all go through it,
// also in handlers derived before it was set; before, records pass as they are.
func TestRedactHandler(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	h := NewRedactHandler(slog.NewTextHandler(&buf, nil))
	log := slog.New(h)
	derived := log.With("part", "dns")
	log.Info("before s3cret")
	if !strings.Contains(buf.String(), "before s3cret") {
		t.Fatalf("a record before SetRedactor was changed: %q", buf.String())
	}
	buf.Reset()
	h.SetRedactor(func(s string) string { return strings.ReplaceAll(s, "s3cret", "[R]") })
	log.With("id", "s3cret-1").Info("msg s3cret", "s", "a s3cret", "err", errors.New("e s3cret"),
		slog.Group("g", "x", "s3cret"))
	derived.Info("derived s3cret")
	out := buf.String()
	if strings.Contains(out, "s3cret") {
		t.Errorf("the redacted log still holds the value: %q", out)
	}
	if n := strings.Count(out, "[R]"); n != 6 {
		t.Errorf("%d redaction markers, want 6: %q", n, out)
	}
}
