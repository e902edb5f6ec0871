// Package logredact is the one redactor of what vibedom writes to its logs:
// the Redactor of a session (known values in every form the DLP engine
// knows, credential recognizers, known values in any letter case) and the
// slog handler that runs session.log's messages and attributes through it.
// netfilter's LogWriter uses the same Redactor for network.jsonl and
// alerts.jsonl. It writes no log itself and keeps PII (a log line's
// addresses and paths are what the user reads it for).
package logredact

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"

	"github.com/vibedom/vibedom/dlp"
)

// Redactor replaces the secrets in a string logged from the guest's
// traffic, returning s itself when there is none. It must be safe for
// concurrent use.
type Redactor func(s string) string

// RedactedKnown replaces a whole logged string that holds a known value in
// a form the engine's scan does not see (a DNS name is lower-cased).
const RedactedKnown = "[REDACTED:known value in a logged string]"

// LogRedactor is the Redactor of a session's logs: known values in every
// form the engine knows (raw, base64, hex, URL and JSON escapes), the
// credential recognizers (tokens, keys, JWTs, URL passwords), and known
// values in any letter case (the whole string is then replaced). PII is
// kept: a log line's addresses and paths are what the user reads it for.
func LogRedactor(e *dlp.Engine) Redactor {
	pol := e.PolicyForClass(dlp.ClassPublic)
	for _, c := range dlp.Categories() {
		switch c {
		case dlp.CatSecret, dlp.CatPrivateKey, dlp.CatCloudKey, dlp.CatToken, dlp.CatJWT, dlp.CatCredentials, dlp.CatPassword:
			pol = pol.With(c, dlp.Redact)
		default:
			pol = pol.With(c, dlp.Pass)
		}
	}
	return func(s string) string {
		if s == "" {
			return s
		}
		out := string(e.ScrubText(&pol, []byte(s), "log", &dlp.Report{}))
		if e.ContainsKnownFold(out) {
			return RedactedKnown
		}
		return out
	}
}

// RedactHandler is a slog.Handler that runs the message and every string
// (and error or Stringer) attribute through a Redactor before handing the
// record on: the session log's choke point, as LogWriter is the network
// log's. Until SetRedactor is called, records pass unchanged.
type RedactHandler struct {
	next slog.Handler
	r    *atomic.Pointer[Redactor]
}

// NewRedactHandler wraps next.
func NewRedactHandler(next slog.Handler) *RedactHandler {
	return &RedactHandler{next: next, r: new(atomic.Pointer[Redactor])}
}

// SetRedactor sets the Redactor of h and of every handler derived from it
// (WithAttrs, WithGroup) from now on.
func (h *RedactHandler) SetRedactor(r Redactor) {
	if r == nil {
		h.r.Store(nil)
		return
	}
	h.r.Store(&r)
}

// Enabled implements slog.Handler.
func (h *RedactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

// Handle implements slog.Handler.
func (h *RedactHandler) Handle(ctx context.Context, rec slog.Record) error {
	rp := h.r.Load()
	if rp == nil {
		return h.next.Handle(ctx, rec)
	}
	r := *rp
	out := slog.NewRecord(rec.Time, rec.Level, r(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(r, a))
		return true
	})
	return h.next.Handle(ctx, out)
}

// WithAttrs implements slog.Handler. Attributes given now are redacted now
// when a Redactor is set (those of the session's start carry no guest data).
func (h *RedactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if rp := h.r.Load(); rp != nil {
		as = slices.Clone(as)
		for i := range as {
			as[i] = redactAttr(*rp, as[i])
		}
	}
	return &RedactHandler{next: h.next.WithAttrs(as), r: h.r}
}

// WithGroup implements slog.Handler.
func (h *RedactHandler) WithGroup(name string) slog.Handler {
	return &RedactHandler{next: h.next.WithGroup(name), r: h.r}
}

func redactAttr(r Redactor, a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, r(v.String()))
	case slog.KindGroup:
		g := v.Group()
		out := make([]any, len(g))
		for i, x := range g {
			out[i] = redactAttr(r, x)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, r(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, r(x.String()))
		case []byte:
			return slog.String(a.Key, r(string(x)))
		default:
			return slog.String(a.Key, r(fmt.Sprint(x)))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
