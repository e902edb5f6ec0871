package preflight

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/vibedom/vibedom/termtext"
)

func TestWriteJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	writeTree(t, e.ws, map[string]string{
		"src/aws.py":   "key = '" + awsKey() + "'\n",
		".env.local":   envPassword(passValue),
		"approved.env": "GITHUB_TOKEN=" + githubPAT("1") + "\n",
		"ignored.env":  "GITHUB_TOKEN=" + githubPAT("2") + "\n",
		IgnoreFile:     "ignored.env:github-pat:1\n",
	})
	r := e.scan(t)
	var appr []Finding
	for _, f := range r.Unapproved() {
		if f.File == "approved.env" {
			appr = append(appr, f)
		}
	}
	must(t, r.approve(appr))
	out := filepath.Join(t.TempDir(), "gitleaks_report.json")
	must(t, r.WriteJSON(out))
	b, err := os.ReadFile(out)
	must(t, err)

	t.Run("no secret in the file", func(t *testing.T) {
		for _, s := range r.Secrets() {
			if bytes.Contains(b, []byte(s)) || bytes.Contains(b, []byte(s[:8])) {
				t.Errorf("report holds a secret of length %d or its first 8 characters", len(s))
			}
		}
	})

	var doc map[string]any
	must(t, json.Unmarshal(b, &doc))
	t.Run("top-level schema", func(t *testing.T) {
		want := map[string]string{
			"version": "number", "tool": "string", "workspace": "string", "scanned_at": "string",
			"duration_ms": "number", "config_digest": "string", "summary": "object", "stats": "object",
			"skipped": "array", "warnings": "array", "findings": "array",
		}
		checkKeys(t, "report", doc, want)
		if doc["version"] != float64(JSONVersion) {
			t.Errorf("version: got %v, want %d", doc["version"], JSONVersion)
		}
	})
	t.Run("summary", func(t *testing.T) {
		sum := doc["summary"].(map[string]any)
		want := map[string]float64{"total": 4, "unapproved": 2, "unapproved_high": 1, "approved": 1, "ignored": 1, "high": 1, "medium": 2, "low": 1}
		for k, v := range want {
			if sum[k] != v {
				t.Errorf("summary.%s: got %v, want %v", k, sum[k], v)
			}
		}
	})
	t.Run("stats", func(t *testing.T) {
		checkKeys(t, "stats", doc["stats"].(map[string]any), map[string]string{
			"files": "number", "scanned": "number", "cache_hits": "number", "bytes_scanned": "number",
			"binary": "number", "too_large": "number", "empty": "number", "symlinks": "number",
			"special": "number", "allowlisted": "number",
		})
	})
	t.Run("findings", func(t *testing.T) {
		fs := doc["findings"].([]any)
		if len(fs) != 4 {
			t.Fatalf("findings: got %d, want 4", len(fs))
		}
		for i, x := range fs {
			f := x.(map[string]any)
			want := map[string]string{
				"fingerprint": "string", "file": "string", "line": "number", "rule": "string",
				"description": "string", "risk": "string", "reason": "string", "status": "string",
				"secret_redacted": "string", "secret_length": "number", "entropy": "number",
			}
			if f["status"] == "unapproved" {
				want["number"] = "number"
			}
			checkKeys(t, fmt.Sprintf("findings[%d]", i), f, want)
			if !slices.Contains([]any{"HIGH", "MEDIUM", "LOW"}, f["risk"]) {
				t.Errorf("findings[%d].risk: %v", i, f["risk"])
			}
			if !slices.Contains([]any{"unapproved", "approved", "ignored"}, f["status"]) {
				t.Errorf("findings[%d].status: %v", i, f["status"])
			}
		}
		first := fs[0].(map[string]any)
		if first["risk"] != "HIGH" || first["number"] != float64(1) || first["secret_redacted"] != "AKIA…(20 chars)" || first["secret_length"] != float64(20) {
			t.Errorf("findings[0]: got %v", first)
		}
	})
}

func checkKeys(t *testing.T, what string, m map[string]any, want map[string]string) {
	t.Helper()
	for k, typ := range want {
		v, ok := m[k]
		if !ok {
			t.Errorf("%s: no key %q", what, k)
			continue
		}
		var got string
		switch v.(type) {
		case float64:
			got = "number"
		case string:
			got = "string"
		case map[string]any:
			got = "object"
		case []any:
			got = "array"
		case bool:
			got = "bool"
		default:
			got = fmt.Sprintf("%T", v)
		}
		if got != typ {
			t.Errorf("%s.%s: got %s, want %s", what, k, got, typ)
		}
	}
	for k := range m {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: undocumented key %q", what, k)
		}
	}
}

// TestFindingNeverPrintsSecret tries every way a finding reaches text.
func TestFindingNeverPrintsSecret(t *testing.T) {
	t.Parallel()
	f := Finding{Fingerprint: "a.env:github-pat:1", File: "a.env", RuleID: "github-pat", Risk: RiskMedium, secret: githubPAT("1")}
	var logBuf bytes.Buffer
	slog.New(slog.NewJSONHandler(&logBuf, nil)).Info("x", "finding", f, "key", approvalKey("0123456789abcdef0123456789abcdef"))
	slog.New(slog.NewTextHandler(&logBuf, nil)).Info("x", "finding", f, "findings", []Finding{f})
	js, _ := json.Marshal(f)
	outputs := map[string]string{
		"%v": fmt.Sprintf("%v", f), "%+v": fmt.Sprintf("%+v", f), "%#v": fmt.Sprintf("%#v", f),
		"%s": fmt.Sprintf("%s", f), "%q": fmt.Sprintf("%q", f), "%x": fmt.Sprintf("%x", f),
		"pointer %+v": fmt.Sprintf("%+v", &f), "slice %v": fmt.Sprintf("%v", []Finding{f}),
		"slog": logBuf.String(), "json": string(js),
		"key %x": fmt.Sprintf("%x %v %s", approvalKey("0123456789abcdef"), approvalKey("0123456789abcdef"), approvalKey("0123456789abcdef")),
	}
	for name, out := range outputs {
		t.Run(name, func(t *testing.T) {
			if strings.Contains(out, githubPAT("1")[4:]) || strings.Contains(out, "0123456789abcdef") {
				t.Errorf("secret printed: %s", out)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", "(whole file)"},
		{"root", "…(4 chars)"},
		{"elevenchars", "…(11 chars)"},
		{"twelve-chars", "twel…(12 chars)"},
		{awsKey(), "AKIA…(20 chars)"},
		{"пароль-секрет-ключ", "паро…(18 chars)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := redact(tt.in); got != tt.want {
				t.Errorf("redact: got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestWriteTextEscapes: a file name is attacker-chosen; it must not be able
// to clear the screen, fake lines in the prompt or hide what it is. Every
// class of character termtext escapes is shown escaped, none raw.
func TestWriteTextEscapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	names := map[string]string{ // on disk -> shown
		"x\x1b[2J\x1b[1;1Hfake\rline\u202e.env": `"x\x1b[2J\x1b[1;1Hfake\rline\u202e.env"`,
		"c1\u009b31m\u0085.env":                 `"c1\u009b31m\u0085.env"`,
		"byte\x9b\xff.env":                      `"byte\x9b\xff.env"`,
		"bidi\u2066\u200e\u061c.env":            `"bidi\u2066\u200e\u061c.env"`,
		"sep\u2028\u2029zw\u200b\ufeff.env":     `"sep\u2028\u2029zw\u200b\ufeff.env"`,
		"tag\U000e0041\u3164.env":               `"tag\U000e0041\u3164.env"`,
	}
	tree := map[string]string{}
	for n := range names {
		tree[n] = "GITHUB_TOKEN=" + githubPAT("1") + "\n"
	}
	writeTree(t, e.ws, tree)
	r := e.scan(t)
	var out bytes.Buffer
	must(t, r.WriteText(&out))
	s := out.String()
	for i := 0; i < len(s); {
		c, n := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && n == 1 || c != '\n' && !termtext.Safe(c) {
			t.Errorf("output holds %q raw at %d: %q", s[i:i+n], i, s)
		}
		i += n
	}
	for _, shown := range names {
		if !strings.Contains(s, shown) {
			t.Errorf("escaped name %s missing: %s", shown, s)
		}
	}
}
