package dlp

import (
	"strings"
	"testing"
)

// detection is a text and the part of it a recognizer must redact.
type detection struct{ text, value string }

// wantRedacted checks that each detection's value is replaced by
// [REDACTED:<cat>] for every class of redact, and that the text passes
// byte for byte to every class of pass.
func wantRedacted(t *testing.T, e *Engine, cat Category, ds []detection, redact, pass []Class) {
	t.Helper()
	for _, d := range ds {
		for _, class := range redact {
			out, rep := scrubText(t, e, class, d.text)
			if strings.Contains(out, d.value) || !strings.Contains(out, "[REDACTED:"+cat.String()+"]") {
				t.Errorf("%v: %q -> %q (%v)", class, d.text, out, rep.Findings())
			}
		}
		wantUntouched(t, e, []string{d.text}, pass...)
	}
}

// wantUntouched checks that each text passes byte for byte to every class
// of classes: the benign twins.
func wantUntouched(t *testing.T, e *Engine, texts []string, classes ...Class) {
	t.Helper()
	for _, in := range texts {
		for _, class := range classes {
			if out, rep := scrubText(t, e, class, in); out != in {
				t.Errorf("%v: %q -> %q (%v)", class, in, out, rep.Findings())
			}
		}
	}
}
