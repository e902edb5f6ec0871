package dlp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"
)

// j joins fixture parts at run time, so that the project's own secrets
// scan does not find its test fixtures.
func j(parts ...string) string { return strings.Join(parts, "") }

// Fixtures, built at run time.
var (
	awsKey      = j("AKIA", "Z7QX3M4P", "2KD9WLNB")
	gcpKey      = j("AIza", "SyD8x-3kLq0Zp7Vn2Rt5Wm9Yb4Hc6Jf1Eg7")
	ghToken     = j("ghp_", "R8mKq2Lx7Vn4Tp9Wz3Yb6Hc1Jf5Gd0Se8Ua1")
	ghPAT       = j("github_pat_", "11AQZX4KY0dH7mP2rL9sT6vW3nB8cF5gJ1eK4oU7iY0a")
	glToken     = j("glpat-", "x9Kq2Lm7Vn4Tp8Wz3Yb6")
	slackToken  = j("xoxb-", "2419382731-9481723561-Zx8Qm2Lk7Vn4")
	stripeKey   = j("sk_", "live_", "51HxQ2mKq8Lx7Vn4Tp9Wz3Yb")
	antKey      = j("sk-ant-", "api03-Zx8Qm2Lk7Vn4Tp9Wr3Yb6Hc1Jf5Gd0S")
	openAIProj  = j("sk-proj-", "Zx8Qm2Lk7Vn4Tp9Wr3Yb6Hc1Jf5Gd0S")
	openAILeg   = j("sk-", "Zx8Qm2Lk7Vn4Tp9Wr3Yb", "T3Blbk", "FJ", "a1B2c3D4e5F6g7H8i9J0")
	npmToken    = j("npm_", "Zx8Qm2Lk7Vn4Tp9Wr3Yb6Hc1Jf5Gd0Sa2Ub9")
	jwtToken    = j("eyJhbGciOiJIUzI1NiJ9", ".", "eyJzdWIiOiIxMjM0NTY3ODkwIn0", ".", "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")
	ageKey      = j("AGE-SECRET-KEY-1", strings.Repeat("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 2)[:58])
	bearerValue = j("Zx8Qm2Lk7Vn4Tp9Wr3Yb", "6Hc1")
)

// pemKey is a real PEM private key block.
func pemKey(t testing.TB) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: j("PRIVATE", " KEY"), Bytes: der}))
}

func scrubText(t testing.TB, e *Engine, class Class, in string) (string, *Report) {
	t.Helper()
	pol := e.PolicyForClass(class)
	out, rep, err := e.ScrubBytes(&pol, []byte(in), StreamOptions{ContentType: "text/plain"})
	if err != nil {
		t.Fatalf("scrub %q: %v", in, err)
	}
	return string(out), rep
}

func mustEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestRecognizers(t *testing.T) {
	pk := pemKey(t)
	basic := base64.StdEncoding.EncodeToString([]byte("alice:" + j("Tr0ub4dor", "&3x")))
	tests := []struct {
		name, in, want string
	}{
		// Cloud keys.
		{"aws key id", "id " + awsKey + " end", "id [REDACTED:CLOUD_KEY] end"},
		{"aws in assignment keeps the name", "AWS_ACCESS_KEY_ID=" + awsKey, "AWS_ACCESS_KEY_ID=[REDACTED:CLOUD_KEY]"},
		{"aws lower case is not a key", strings.ToLower(awsKey), strings.ToLower(awsKey)},
		{"aws too long is not a key", awsKey + "X", awsKey + "X"},
		{"aws inside a word is not a key", "X" + awsKey, "X" + awsKey},
		{"gcp key", "k=" + gcpKey + ";", "k=[REDACTED:CLOUD_KEY];"},
		// Tokens.
		{"github token", "token: " + ghToken, "token: [REDACTED:TOKEN]"},
		{"github fine-grained", ghPAT, "[REDACTED:TOKEN]"},
		{"gitlab token", "PRIVATE-TOKEN " + glToken, "PRIVATE-TOKEN [REDACTED:TOKEN]"},
		{"slack token", slackToken, "[REDACTED:TOKEN]"},
		{"stripe live key", "stripe(" + stripeKey + ")", "stripe([REDACTED:TOKEN])"},
		{"anthropic key", "key " + antKey, "key [REDACTED:TOKEN]"},
		{"openai project key", openAIProj, "[REDACTED:TOKEN]"},
		{"openai legacy key", "x " + openAILeg + " y", "x [REDACTED:TOKEN] y"},
		{"npm token", "//registry.npmjs.org/:_authToken=" + npmToken, "//registry.npmjs.org/:_authToken=[REDACTED:TOKEN]"},
		{"bearer credential", "Authorization: Bearer " + bearerValue, "Authorization: Bearer [REDACTED:TOKEN]"},
		{"bearer lower case", "bearer " + bearerValue + "\n", "bearer [REDACTED:TOKEN]\n"},
		{"bearer word is not a credential", "use a Bearer token scheme", "use a Bearer token scheme"},
		{"basic credential", "Authorization: Basic " + basic, "Authorization: Basic [REDACTED:TOKEN]"},
		{"basic word is not a credential", "basic configuration options", "basic configuration options"},
		{"jwt", "cookie=" + jwtToken + "; path=/", "cookie=[REDACTED:JWT]; path=/"},
		// Private keys.
		{"pem private key block", "key:\n" + pk + "done", "key:\n[REDACTED:PRIVATE_KEY]\ndone"},
		{"pem certificate is not a key", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"},
		{"age secret key", "# key\n" + ageKey + "\n", "# key\n[REDACTED:PRIVATE_KEY]\n"},
		// Connection strings: the password only.
		{"url password", "mysql://admin:" + j("MyP@ss", "w0rd") + "@db.corp.io/app", "mysql://admin:[REDACTED:CREDENTIALS]@db.corp.io/app"},
		{"url password, several @", "postgres://u:" + j("p@ss@", "word1") + "@h.io:5432", "postgres://u:[REDACTED:CREDENTIALS]@h.io:5432"},
		{"url without password", "git+ssh://git@github.com/org/repo.git", "git+ssh://git@github.com/org/repo.git"},
		{"url placeholder password", "postgres://user:${DB_PASSWORD}@db/app", "postgres://user:${DB_PASSWORD}@db/app"},
		{"url password literal placeholder", "postgres://user:password@localhost/app", "postgres://user:password@localhost/app"},
		// Assignments.
		{"password assignment", "DB_PASSWORD=" + j("Zq8#mK2", "vL9x"), "DB_PASSWORD=[REDACTED:PASSWORD]"},
		{"json-ish assignment", `"client_secret": "` + j("x8Kq2Lm7", "Vn4Tp8Wz") + `"`, `"client_secret": "[REDACTED:PASSWORD]"`},
		{"yaml assignment", "api_key: " + j("f83kd92LsQ", "x0P") + "\n", "api_key: [REDACTED:PASSWORD]\n"},
		{"go assignment", "secret := \"" + j("aZ3$k9", "Lm2Qp") + "\"", "secret := \"[REDACTED:PASSWORD]\""},
		{"low entropy value kept", "password = hunter22", "password = hunter22"},
		{"reference kept", "token = process.env.GITHUB_TOKEN", "token = process.env.GITHUB_TOKEN"},
		{"call kept", "token = getToken(ctx)", "token = getToken(ctx)"},
		{"identifier kept", "password: passwordInput", "password: passwordInput"},
		{"comparison kept", "if token == " + j("aZ3k9Lm2", "Qp") + " {", "if token == " + j("aZ3k9Lm2", "Qp") + " {"},
		{"other key name kept", `"tokenizer": "cl100k_base"`, `"tokenizer": "cl100k_base"`},
		{"max_tokens kept", `"max_tokens": 1024`, `"max_tokens": 1024`},
		// PII.
		{"email", "mail alice.smith+x@corp-mail.io now", "mail [REDACTED:EMAIL] now"},
		{"email rfc 2606 kept", "bob@example.com, eve@mail.example.org, x@y.test", "bob@example.com, eve@mail.example.org, x@y.test"},
		{"scp remote kept", "git@gitlab.corp.io:team/app.git", "git@gitlab.corp.io:team/app.git"},
		{"retina file name kept", "logo@2x.png", "logo@2x.png"},
		{"npm scope kept", `"@babel/core": "^7.24.0"`, `"@babel/core": "^7.24.0"`},
		{"card", "card 4111 1111 1111 1111 exp", "card [REDACTED:CREDIT_CARD] exp"},
		{"card no spaces", "4556737586899855", "[REDACTED:CREDIT_CARD]"},
		{"card dashes amex", "3782-822463-10005", "[REDACTED:CREDIT_CARD]"},
		{"luhn-failing number kept", "4111 1111 1111 1112", "4111 1111 1111 1112"},
		{"timestamp kept", "1732345678901", "1732345678901"},
		{"private ip", "host 10.1.2.3 port", "host [REDACTED:INTERNAL_IP] port"},
		{"private ip 172", "172.20.0.5:8080", "[REDACTED:INTERNAL_IP]:8080"},
		{"private ip 192.168", "(192.168.1.50)", "([REDACTED:INTERNAL_IP])"},
		{"public ip kept", "8.8.8.8 and 172.32.0.1", "8.8.8.8 and 172.32.0.1"},
		{"version kept", "10.0.0.1-beta", "10.0.0.1-beta"},
		{"v-version kept", "v10.1.2.3", "v10.1.2.3"},
		{"dotted version kept", "10.1.2.3.4", "10.1.2.3.4"},
		{"home path kept for external", "/Users/alice/src/app", "/Users/alice/src/app"},
	}
	e := mustEngine(t, Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := scrubText(t, e, ClassExternal, tt.in)
			if got != tt.want {
				t.Errorf("scrub\n  %q\ngot\n  %q\nwant\n  %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestHomePathsForPublic(t *testing.T) {
	e := mustEngine(t, Config{})
	tests := []struct{ in, want string }{
		{"/Users/alice/src/app", "/Users/[REDACTED:HOME_PATH]/src/app"},
		{`open("/home/bob/.ssh/id")`, `open("/home/[REDACTED:HOME_PATH]/.ssh/id")`},
		{`C:\Users\carol\app`, `C:\Users\[REDACTED:HOME_PATH]\app`},
		{"file:///Users/dave/x", "file:///Users/[REDACTED:HOME_PATH]/x"},
		{"https://site.io/home/index", "https://site.io/home/index"},
		{"/Users/Shared/x", "/Users/Shared/x"},
	}
	for _, tt := range tests {
		got, _ := scrubText(t, e, ClassPublic, tt.in)
		if got != tt.want {
			t.Errorf("public: %q -> %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCardNumbers(t *testing.T) {
	valid := []string{"4111111111111111", "5555555555554444", "2223003122003222", "378282246310005", "6011111111111117",
		"3056930009020004", "3566002020360505", "4000056655665556", "6200000000000005"}
	for _, v := range valid {
		if !cardNumber([]byte(v), []int{len(v)}) {
			t.Errorf("%s: not recognized", v)
		}
	}
	invalid := []string{"4111111111111112", "1234567812345670", "9111111111111111", "41111111111111"}
	for _, v := range invalid {
		if cardNumber([]byte(v), []int{len(v)}) {
			t.Errorf("%s: recognized", v)
		}
	}
}

func TestSecretValue(t *testing.T) {
	tests := []struct {
		v    string
		want bool
	}{
		{"Zq8#mK2vL9x", true}, {"f83kd92LsQx0P", true}, {"hunter22", false}, {"password", false},
		{"${SECRET}", false}, {"{{ .Token }}", false}, {"xxxxxxxxxxxx", false}, {"process.env.X", false},
		{"getToken()", false}, {"your-api-key-here", false}, {"changeme123", false}, {"abcdefghijklmnopqrstuvwxyz", false}, {"qWeRtZuIoPaSdFgHjKlYxCvB", true},
		{"passwordInput", false}, {"aaaaBBBB1111", false},
	}
	for _, tt := range tests {
		if got := secretValue([]byte(tt.v)); got != tt.want {
			t.Errorf("secretValue(%q) = %v, want %v", tt.v, got, tt.want)
		}
	}
}

func TestSecretKeyName(t *testing.T) {
	for _, k := range []string{"password", "DB_PASSWORD", "apiKey", "client_secret", "secret_key", "authToken", "x-api-key", "PRIVATE_KEY"} {
		if !secretKeyName([]byte(k)) {
			t.Errorf("%q: not a secret name", k)
		}
	}
	for _, k := range []string{"tokenizer", "max_tokens", "passwordless", "secretary", "content", "role"} {
		if secretKeyName([]byte(k)) {
			t.Errorf("%q: taken for a secret name", k)
		}
	}
}
