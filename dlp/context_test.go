package dlp

import (
	"encoding/base64"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestSecretsByContext: a hex or base64 token of a secret's length
// assigned to a secret-like name is redacted in env files, JSON, YAML and
// code, also deep inside a body larger than a window; the same names with
// values that are no secret (placeholders, references, words) and the same
// values under names that hold no secret pass untouched.
func TestSecretsByContext(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{})
	// Fixed random values: about 1.5 % of random 32-character tokens fall
	// below the entropy bar secretValue sets (docs/dlp.md), so values
	// drawn afresh each run made this test fail now and then.
	r := rand.New(rand.NewPCG(23, 1))
	rnd := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	hex40 := hex.EncodeToString(rnd(20))
	hex64 := strings.ToUpper(hex.EncodeToString(rnd(32)))
	b64 := base64.StdEncoding.EncodeToString(rnd(32))
	b64url := base64.RawURLEncoding.EncodeToString(rnd(24))
	filler := strings.Repeat("func handler(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, \"ok\") } // 42\n", 1200) // ~100 KiB
	cases := []struct{ text, value, ctype string }{
		{"PAYMENTS_API_TOKEN=" + hex40 + "\n", hex40, "text/plain"},
		{"export SIGNING_SECRET='" + hex64 + "'\n", hex64, "text/plain"},
		{`{"db_password": "` + b64 + `", "user": "app"}`, b64, "application/json"},
		{"database:\n  password: \"" + b64url + "\"\n", b64url, "application/yaml"},
		{"const apiToken = \"" + hex40 + "\";\n", hex40, "text/plain"},
		{"client_secret := \"" + b64 + "\"\n", b64, "text/plain"},
		{"self.webhook_secret = '" + hex64 + "'\n", hex64, "text/plain"},
		{filler + "PAYMENTS_API_TOKEN=" + hex40 + "\n" + filler, hex40, "text/plain"},
		{`{"messages":[{"content":"` + strings.ReplaceAll(filler, "\n", `\n`) + `export DB_PASSWORD=` + b64 + `\n"}]}`, b64, "application/json"},
		{`{"pad":"` + strings.Repeat("x", 90<<10) + `","config":{"api_token":"` + hex40 + `"}}`, hex40, "application/json"},
	}
	for _, c := range cases {
		pol := e.PolicyForClass(ClassExternal)
		out, _, err := e.ScrubBytes(&pol, []byte(c.text), StreamOptions{ContentType: c.ctype})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), c.value) || !strings.Contains(string(out), "[REDACTED:PASSWORD]") {
			t.Errorf("%.60q… (%d bytes): %s not redacted", c.text, len(c.text), c.value)
		}
	}
	twins := []string{
		"PAYMENTS_API_TOKEN=${PAYMENTS_API_TOKEN}\n",
		"PAYMENTS_API_TOKEN=changeme\n",
		`{"db_password": "", "next_page_token": "` + hex40 + `"}`,
		"commit_sha = \"" + hex40 + "\"\n",
		"const apiToken = process.env.API_TOKEN;\n",
		"database:\n  password: ${DB_PASSWORD}\n",
		"checksum: " + hex64 + "\n",
		"max_tokens = 4096\n",
		filler + "etag = \"" + hex40 + "\"\n",
	}
	for _, in := range twins {
		for _, class := range []Class{ClassExternal, ClassPublic} {
			if out, rep := scrubText(t, e, class, in); out != in {
				t.Errorf("%v: %.80q changed (%v)", class, in, rep.Findings())
			}
		}
	}
}
