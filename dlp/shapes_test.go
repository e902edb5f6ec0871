package dlp

import (
	"encoding/base64"
	"testing"
)

// TestShapesOnly: under Policy.ShapesOnly (a credential header's) a value
// is found by its own shape or as a known value, never by the words
// before it: "Bearer ", "Basic " and secret-like names find nothing there.
func TestShapesOnly(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret, Source: ".env:1 API_KEY"}}})
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+j("Tr0ub4dor", "&3x")))
	tests := []struct{ name, in, shapes, full string }{
		{"aws", "s=" + awsKey, "s=[REDACTED:CLOUD_KEY]", "s=[REDACTED:CLOUD_KEY]"},
		{"github bearer", "Bearer " + ghToken, "Bearer [REDACTED:TOKEN]", "Bearer [REDACTED:TOKEN]"},
		{"jwt", jwtToken, "[REDACTED:JWT]", "[REDACTED:JWT]"},
		{"known", "Bearer " + knownSecret, "Bearer [REDACTED:SECRET]", "Bearer [REDACTED:SECRET]"},
		{"opaque bearer", "Bearer " + bearerValue, "Bearer " + bearerValue, "Bearer [REDACTED:TOKEN]"},
		{"basic", basic, basic, "Basic [REDACTED:TOKEN]"},
		{"assignment", "db_password=" + j("f83kd92L", "sQx0P"), "db_password=" + j("f83kd92L", "sQx0P"), "db_password=[REDACTED:PASSWORD]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			full := e.PolicyForClass(ClassPublic)
			shapes := full.ShapesOnly()
			if got := string(e.ScrubText(&shapes, []byte(tc.in), "header:Authorization", &Report{})); got != tc.shapes {
				t.Errorf("shapes only: got %q, want %q", got, tc.shapes)
			}
			if got := string(e.ScrubText(&full, []byte(tc.in), "header:X-Note", &Report{})); got != tc.full {
				t.Errorf("full policy: got %q, want %q", got, tc.full)
			}
		})
	}
}
