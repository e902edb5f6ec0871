package dlp

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
)

func TestParseEnv(t *testing.T) {
	in := "# comment\n" +
		"export API_KEY=" + knownSecret + "\n" +
		"PLAIN=value with spaces # a comment\n" +
		"QUOTED=\"line1\\nline2 \\\"q\\\"\"\n" +
		"SINGLE='it''s raw \\n'\n" +
		"MULTI=\"first\nsecond\"\n" +
		"EMPTY=\n" +
		"not an assignment\n" +
		"1BAD=x\n" +
		"WIN=crlf\r\n"
	got := ParseEnv([]byte(in))
	want := []EnvVar{
		{"API_KEY", knownSecret, 2}, {"PLAIN", "value with spaces", 3}, {"QUOTED", "line1\nline2 \"q\"", 4},
		{"SINGLE", "it", 5}, {"MULTI", "first\nsecond", 6}, {"EMPTY", "", 8}, {"WIN", "crlf", 11},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d vars: %v", len(got), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("var %d: got %q=%q line %d, want %q=%q line %d", i, got[i].Key, got[i].Value, got[i].Line, want[i].Key, want[i].Value, want[i].Line)
		}
	}
}

func TestEnvSecret(t *testing.T) {
	tests := []struct {
		key, value string
		want       bool
	}{
		{"API_KEY", knownSecret, true},
		{"STRIPE_SECRET", "sk_test_abcdefgh", true},
		{"DB_PASSWORD", "correct-horse", true},
		{"DB_PASSWORD", "root", false}, // too short to match safely
		{"APP_ENV", "production", false},
		{"DEBUG", "false", false},
		{"PORT", "8080", false},
		{"TIMEOUT", "30.5", false},
		{"API_URL", "https://api.example.com/v1", false},
		{"DATABASE_URL", "postgres://app:" + j("S3cretPa", "ssw0rd") + "@db:5432/app", true},
		{"KEY_FILE", "/etc/ssl/private/key.pem", false},
		{"SECRET_KEY", "${VAULT_SECRET}", false},
		{"SESSION_SALT", "xxxxxxxxxxxxxxxx", false},
		{"RANDOM_ID", j("aK9xQ2mL7pV4", "tR8wZ3yB"), true},
		{"GREETING", "hello-world-example", false},
	}
	for _, tt := range tests {
		if got, why := EnvSecret(tt.key, tt.value); got != tt.want {
			t.Errorf("%s=%q: %v (%s), want %v", tt.key, tt.value, got, why, tt.want)
		}
	}
}

func TestParseAllowlist(t *testing.T) {
	a, err := ParseAllowlist(strings.NewReader("# ok\nPearl St\n  re:.*@team\\.io  \ncontext:internal_ips\n\n"), "al")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Values) != 1 || a.Values[0] != "Pearl St" || len(a.Patterns) != 1 || len(a.Categories) != 1 || a.Categories[0] != CatInternalIP {
		t.Errorf("parsed %+v", a)
	}
	for _, bad := range []string{"re:(\n", "re:.*\n", "re:\n", "context:everything\n"} {
		if _, err := ParseAllowlist(strings.NewReader(bad), "al"); err == nil || !strings.Contains(err.Error(), "al:1") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := ParseAllowPattern("re:x*"); err == nil {
		t.Error("a pattern matching the empty string was accepted")
	}
}

func TestAuditLog(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	path := filepath.Join(t.TempDir(), AuditFile)
	a, err := CreateAuditLog(path, id.Recipient())
	if err != nil {
		t.Fatal(err)
	}
	recs := []AuditRecord{{Dest: "api.anthropic.com:443", Category: "SECRET", Action: "redact", Where: "body", Value: knownSecret},
		{Dest: "api.anthropic.com:443", Category: "EMAIL", Action: "redact", Where: "url", Value: "bob@corp.io"}}
	if err := a.Record(recs...); err != nil {
		t.Fatal(err)
	}
	if err := a.Record(recs[0]); err != nil {
		t.Fatal(err)
	}
	a.Close()
	data, _ := os.ReadFile(path)
	if bytes.Contains(data, []byte(knownSecret)) || bytes.Contains(data, []byte("bob@corp.io")) {
		t.Fatal("the audit log holds a value in clear")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode().Perm())
	}
	var got []string
	if err := ReadAuditLog(bytes.NewReader(data), func(r AuditRecord) error { got = append(got, r.Value); return nil }, id); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != knownSecret+",bob@corp.io,"+knownSecret {
		t.Errorf("decrypted %v", got)
	}
	// A torn last line (a crash) costs that line only.
	torn := append(append([]byte{}, data...), data[:40]...)
	got = nil
	err = ReadAuditLog(bytes.NewReader(torn), func(r AuditRecord) error { got = append(got, r.Value); return nil }, id)
	if err == nil || !strings.Contains(err.Error(), "line 3") || len(got) != 3 {
		t.Errorf("torn log: %v, %d records", err, len(got))
	}
	// Another key cannot read it.
	other, _ := age.GenerateX25519Identity()
	err = ReadAuditLog(bytes.NewReader(data), func(AuditRecord) error { return nil }, other)
	var nm *age.NoIdentityMatchError
	if !errors.As(err, &nm) {
		t.Errorf("wrong key: %v", err)
	}
	if s := recs[0].String(); strings.Contains(s, knownSecret) {
		t.Errorf("record String shows the value: %s", s)
	}
}
