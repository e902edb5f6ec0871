package dlp

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// knownSecret is a workspace secret for the tests, built at run time.
var knownSecret = j("hQ7v", "Zp2L/xK9+wR4tYq=")

func TestKnownValueForms(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret, Source: ".env:1 API_KEY"}}})
	s := []byte(knownSecret)
	r := rand.New(rand.NewPCG(7, 8))
	noise := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return b
	}
	type tc struct {
		name, text string
	}
	var tests []tc
	tests = append(tests, tc{"raw", "key " + knownSecret + " end"})
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		for a := 0; a < 3; a++ {
			for tail := 0; tail < 3; tail++ {
				blob := append(append(noise(a+3*r.IntN(3)), s...), noise(tail)...)
				tests = append(tests, tc{fmt.Sprintf("base64 %v align %d tail %d", enc == base64.URLEncoding || enc == base64.RawURLEncoding, a, tail),
					"data=" + enc.EncodeToString(blob) + ";"})
			}
		}
	}
	tests = append(tests,
		tc{"hex lower", "0x" + hex.EncodeToString(append(noise(5), s...))},
		tc{"hex upper", strings.ToUpper(hex.EncodeToString(append(s, noise(3)...)))},
		tc{"query escaped", "q=" + url.QueryEscape(knownSecret) + "&x=1"},
		tc{"path escaped", "/v1/" + url.PathEscape(knownSecret) + "/x"},
		tc{"every byte percent-encoded", "q=" + string(percentAll(s, lowerHex))},
		tc{"json escaped", func() string { b, _ := json.Marshal(knownSecret); return string(b) }()},
		tc{"json every char escaped", `"` + string(unicodeEscapeAll(knownSecret, upperHex)) + `"`},
		tc{"json solidus escaped", strings.ReplaceAll(knownSecret, "/", `\/`)},
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, rep := scrubText(t, e, ClassExternal, tt.text)
			if !strings.Contains(out, "[REDACTED:SECRET]") {
				t.Fatalf("not redacted: %q -> %q", tt.text, out)
			}
			fs := rep.Findings()
			if len(fs) == 0 || fs[0].Category != CatSecret || fs[0].Source != ".env:1 API_KEY" || fs[0].Value() != knownSecret {
				t.Errorf("finding: %+v", fs)
			}
		})
	}
}

func TestKnownValuesAreDeduplicatedAndBounded(t *testing.T) {
	long := strings.Repeat("Zx8Qm2Lk", MaxSecretLen/8+10)
	e := mustEngine(t, Config{Secrets: []Secret{
		{Value: knownSecret}, {Value: knownSecret}, {Value: "short7!"}, {Value: ""}, {Value: long},
	}})
	if got := e.KnownValues(); got != 2 {
		t.Errorf("known values: got %d, want 2 (a duplicate, a short and an empty one dropped)", got)
	}
	out, _ := scrubText(t, e, ClassExternal, "x "+long+" y short7! z")
	if strings.Contains(out, long[:MaxSecretLen]) || !strings.Contains(out, "short7!") {
		t.Errorf("bounded known values: %q", out)
	}
}

func TestManyKnownValues(t *testing.T) {
	secrets := benchSecrets(1000)
	e := mustEngine(t, Config{Secrets: secrets})
	var in strings.Builder
	for i := 0; i < len(secrets); i += 37 {
		fmt.Fprintf(&in, "v%d=%s\n", i, secrets[i].Value)
	}
	out, rep := scrubText(t, e, ClassExternal, in.String())
	for i := 0; i < len(secrets); i += 37 {
		if strings.Contains(out, secrets[i].Value) {
			t.Errorf("secret %d not redacted", i)
		}
	}
	if n := len(rep.Findings()); n != (len(secrets)+36)/37 {
		t.Errorf("findings: %d", n)
	}
}

func TestAllowlist(t *testing.T) {
	other := j("Qw9Er7Ty", "5Ui3Op1As")
	e := mustEngine(t, Config{
		Secrets: []Secret{{Value: knownSecret}, {Value: other}},
		Allow: Allowlist{Values: []string{knownSecret, "alice@corp.io"}, Categories: []Category{CatInternalIP},
			Patterns: []*regexpAlias{mustRE(`.*@team\.io`)}},
	})
	in := "a " + knownSecret + " b " + other + " alice@corp.io bob@corp.io x@team.io 10.0.0.7"
	out, _ := scrubText(t, e, ClassExternal, in)
	want := "a " + knownSecret + " b [REDACTED:SECRET] alice@corp.io [REDACTED:EMAIL] x@team.io 10.0.0.7"
	if out != want {
		t.Errorf("got  %q\nwant %q", out, want)
	}
}

func TestPolicies(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret, Source: "t"}}})
	in := knownSecret + " bob@corp.io 10.0.0.7 /Users/bob/x " + awsKey
	tests := []struct {
		class   Class
		want    string
		actions string
	}{
		{ClassExternal, "[REDACTED:SECRET] [REDACTED:EMAIL] [REDACTED:INTERNAL_IP] /Users/bob/x [REDACTED:CLOUD_KEY]", "redact redact redact redact"},
		{ClassPublic, "[REDACTED:SECRET] [REDACTED:EMAIL] [REDACTED:INTERNAL_IP] /Users/[REDACTED:HOME_PATH]/x [REDACTED:CLOUD_KEY]", "redact redact redact redact redact"},
		{ClassInternal, in, "log"},
	}
	for _, tt := range tests {
		t.Run(tt.class.String(), func(t *testing.T) {
			out, rep := scrubText(t, e, tt.class, in)
			if out != tt.want {
				t.Errorf("got  %q\nwant %q", out, tt.want)
			}
			var acts []string
			for _, f := range rep.Findings() {
				acts = append(acts, f.Action.String())
			}
			if strings.Join(acts, " ") != tt.actions {
				t.Errorf("actions: %v, want %s", acts, tt.actions)
			}
		})
	}
}

func TestClassRules(t *testing.T) {
	rules, err := ParseClassRules(strings.NewReader("# mine\ninternal *.corp.example\nexternal llm.corp.example\npublic 10.9.0.0/16\n"), "classes")
	if err != nil {
		t.Fatal(err)
	}
	e := mustEngine(t, Config{ClassRules: rules})
	tests := []struct {
		name string
		want Class
	}{
		{"api.anthropic.com", ClassExternal}, {"API.Anthropic.COM.", ClassExternal}, {"console.anthropic.com", ClassExternal},
		{"git.corp.example", ClassInternal}, {"llm.corp.example", ClassExternal}, {"corp.example", ClassPublic},
		{"github.com", ClassPublic}, {"db.internal", ClassInternal}, {"10.1.2.3", ClassInternal}, {"10.9.1.1", ClassPublic},
		{"192.168.1.1", ClassInternal}, {"8.8.8.8", ClassPublic}, {"localhost", ClassInternal},
	}
	for _, tt := range tests {
		if got, _ := e.ClassOf(tt.name); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	for _, bad := range []string{"secret *.x\n", "internal\n", "internal a b\n", "internal *.*.x\n", "internal 10.0.0.0/99\n", "internal ex ample\n"} {
		if _, err := ParseClassRules(strings.NewReader(bad), "f"); err == nil || !strings.Contains(err.Error(), "f:1") {
			t.Errorf("%q: error %v, want one naming f:1", bad, err)
		}
	}
}

func TestParseCategory(t *testing.T) {
	for in, want := range map[string]Category{"internal_ips": CatInternalIP, "EMAIL": CatEmail, "emails": CatEmail,
		"credit-card": CatCreditCard, "secret": CatSecret, "private_keys": CatPrivateKey} {
		if got, err := ParseCategory(in); err != nil || got != want {
			t.Errorf("%q: %v %v", in, got, err)
		}
	}
	if _, err := ParseCategory("everything"); err == nil {
		t.Error("unknown category accepted")
	}
}

func TestFindingNeverShowsValue(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret, Source: "t"}}})
	_, rep := scrubText(t, e, ClassExternal, "x "+knownSecret)
	f := rep.Findings()[0]
	b, _ := json.Marshal(f)
	for _, s := range []string{f.String(), fmt.Sprintf("%v %+v %#v", f, f, f), string(b), f.LogValue().String(), Secret{Value: knownSecret}.String(), fmt.Sprintf("%#v", Secret{Value: knownSecret})} {
		if strings.Contains(s, knownSecret) || strings.Contains(s, knownSecret[4:]) {
			t.Errorf("value shown: %s", s)
		}
	}
	if f.Prefix != knownSecret[:4] || f.Length != len(knownSecret) {
		t.Errorf("prefix %q length %d", f.Prefix, f.Length)
	}
	_, rep = scrubText(t, mustEngine(t, Config{Secrets: []Secret{{Value: "Zx8!Qm2L"}}}), ClassExternal, "Zx8!Qm2L")
	if p := rep.Findings()[0].Prefix; p != "" {
		t.Errorf("a short value shows a prefix %q", p)
	}
}

func TestScrubDoesNotChangeCleanText(t *testing.T) {
	e := mustEngine(t, Config{Secrets: benchSecrets(50)})
	in := []byte(benchText(rand.New(rand.NewPCG(1, 1)), 200<<10))
	out, rep := scrubText(t, e, ClassPublic, string(in))
	if !bytes.Equal([]byte(out), in) {
		t.Errorf("clean text changed (%d findings: %v)", len(rep.Findings()), rep.Findings())
	}
}

type regexpAlias = regexp.Regexp

func mustRE(s string) *regexp.Regexp { return regexp.MustCompile(s) }
