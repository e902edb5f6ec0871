package dlp

import (
	"strings"
	"testing"
)

// truePositives are values each destination class must act on, built at
// run time (j) so the project's own secrets scan stays quiet: service
// tokens found through gitleaks' rules, and personal data for public
// destinations. want is the category reported.
func truePositives() []struct {
	name, text, value string
	cat               Category
} {
	sendgrid := j("SG.", "ngeVfQFYQlKU0ufo8x5d1A", ".", "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr")
	sendinblue := j("xkeysib-", "b8d6f9c1e4a7d2b5c8e1f4a7d0b3c6e9f2a5d8b1c4e7f0a3d6b9c2e5f8a1b4c7", "-", "Zx8Qm2Lk7Vn4Tp9W") // gitleaks:allow
	shopify := j("shpat_", "a1b2c3d4e5f60718293a4b5c6d7e8f90")
	doToken := j("dop_v1_", "4f2a9c1e7b3d8f6a0c5e2b9d7f1a3c8e6b4d2f0a9c7e5b3d1f8a6c4e2b0d9f7a")
	pypi := j("pypi-", "AgEIcHlwaS5vcmc", "CJGE1ZjNiZDI0LTQ5ZDAtNDk4My1iNmFmLTJlNTQ5ZDVkMDlhYQACKlsz")
	return []struct {
		name, text, value string
		cat               Category
	}{
		{"sendgrid", "SENDGRID=" + sendgrid + "\n", sendgrid, CatToken},
		{"sendinblue", `{"k":"` + sendinblue + `"}`, sendinblue, CatToken},
		{"shopify", "token " + shopify + " ok", shopify, CatToken},
		{"digitalocean", "do " + doToken + " ok", doToken, CatToken},
		{"pypi", "password = " + pypi, pypi, CatToken},
		{"ssn", "ssn: 219-09-" + "9999 on file", "219-09-9999", CatSSN},
		{"ssn spaced", "SSN 219 09 " + "9999.", "219 09 9999", CatSSN},
		{"ssn bare", `{"social_security_number":"219` + `099999"}`, "219099999", CatSSN},
		{"ssn words", "Social Security No. 536-22-" + "1234", "536-22-1234", CatSSN},
		{"iban grouped", "pay to DE89 3704 0044 " + "0532 0130 00 today", "DE89 3704 0044 0532 0130 00", CatIBAN},
		{"iban compact", "iban=GB82WEST1234" + "5698765432;", "GB82WEST12345698765432", CatIBAN},
		{"phone e164", "call +44 20 7946 " + "0958 now", "+44 20 7946 0958", CatPhone},
		{"phone e164 compact", `"tel":"+1415` + `5552671"`, "+14155552671", CatPhone},
		{"phone nanp with context", "Phone: (415) 555-" + "2671", "(415) 555-2671", CatPhone},
		{"phone nanp dashes", "mobile 415-555-" + "2671.", "415-555-2671", CatPhone},
		{"phone nanp parentheses", "ring (646) 839-" + "2271 now", "(646) 839-2271", CatPhone},
		{"phone nanp dots", "415.839." + "2271", "415.839.2271", CatPhone},
		{"phone us international", "+1 415-839-" + "2271", "+1 415-839-2271", CatPhone},
		{"phone berlin", "+49 30 901820" + "0 office", "+49 30 9018200", CatPhone},
		{"card dots", "card 4556.7375.8689." + "9855 exp", "4556.7375.8689.9855", CatCreditCard},
	}
}

// falsePositives must come through untouched to every class.
var falsePositives = []string{
	`{"pageToken":"CiAKGjBpNDd2Nmp2Zml2cXRpYjFmbWNlaHRkZWo0MhIECAEQAQ","nextPageToken":"Q2lBS0dqQnBORGQyTm1wMlptbDJjWFJwWWpGbWJXTmxhSFJrWldvME1oSUVDQUVRQVE"}`, // gitleaks:allow
	"GET /v1/items?page_token=CiAKGjBpNDd2Nmp2Zml2cXRpYjFmbWNlaHRkZWo0MhIECAEQAQ&limit=50",                                                                     // gitleaks:allow
	`token = "test-token-123"`,
	`api_key = "my-api-key-for-tests"`,
	"ANTHROPIC_API_KEY=sk-ant-" + "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
	"OPENAI_API_KEY=sk-proj-" + "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
	"aws_access_key_id = AKIAIOSFODNN7" + "EXAMPLE",
	"DATABASE_URL=postgres://postgres:postgres@localhost:5432/app",
	"mysql://root:root@127.0.0.1/db",
	"amqp://guest:guest@rabbitmq:5672/",
	"version 1.2.3-456-7890 build 2024-11-23 id 123-45-6789 and 078-05-1120",
	"order 219099999 and ref 219 09 9999 shipped",                          // nine digits without an SSN word
	"ssn: 900-12-3456, 219-00-1234, 666-12-3456, 000-12-3456, 219-09-0000", // never issued
	"SSN 219-09-99999 and x219-09-9999",
	"ref DE00 1234 5678 9012 3456 78 is not an IBAN",
	"order 415-555-2671 shipped; ticket 415-555-2671",
	"version 415.55.2671 and 10.415.555.2671.1",
	"phone: 555-0123 and tel 415-555-0199",
	"timestamp +0100 offset, +1234 points",
	"client_secret: ${CLIENT_SECRET}",
	`"max_tokens": 4096, "input_tokens": 12345678901234`,
}

// TestCoverageCorpus: the true positives are redacted as their category
// for public destinations (tokens for external ones too; personal data
// passes to them), and the false positives pass unchanged everywhere.
func TestCoverageCorpus(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{})
	for _, tp := range truePositives() {
		t.Run(tp.name, func(t *testing.T) {
			out, rep := scrubText(t, e, ClassPublic, tp.text)
			if strings.Contains(out, tp.value) || !strings.Contains(out, "[REDACTED:"+tp.cat.String()+"]") {
				t.Fatalf("public: %q -> %q", tp.text, out)
			}
			fs := rep.Findings()
			if len(fs) != 1 || fs[0].Category != tp.cat || fs[0].Value() != tp.value {
				t.Errorf("public: findings %v", fs)
			}
			out, _ = scrubText(t, e, ClassExternal, tp.text)
			if pii := tp.cat == CatIBAN || tp.cat == CatPhone; pii != (out == tp.text) {
				t.Errorf("external: %q -> %q", tp.text, out)
			}
			// An SSN is redacted to every class, internal too.
			if out, _ = scrubText(t, e, ClassInternal, tp.text); (tp.cat == CatSSN) != (out != tp.text) {
				t.Errorf("internal: %q -> %q", tp.text, out)
			}
		})
	}
	for _, fp := range falsePositives {
		for _, class := range []Class{ClassPublic, ClassExternal} {
			for _, ct := range []string{"text/plain", "application/json"} {
				pol := e.PolicyForClass(class)
				out, rep, err := e.ScrubBytes(&pol, []byte(fp), StreamOptions{ContentType: ct})
				if err != nil {
					t.Fatal(err)
				}
				if string(out) != fp {
					t.Errorf("%s, %s: %q changed: %q (%v)", class, ct, fp, out, rep.Findings())
				}
			}
		}
	}
}

func TestGitleaksRulesLoaded(t *testing.T) {
	used, skipped, err := GitleaksRulesUsed()
	if err != nil {
		t.Fatal(err)
	}
	if len(used) < 150 {
		t.Errorf("only %d gitleaks rules run on traffic", len(used))
	}
	for _, id := range []string{"sendgrid-api-token", "sendinblue-api-token", "shopify-access-token", "pypi-upload-token"} {
		if !contains(used, id) {
			t.Errorf("%s not run on traffic (skipped: %v)", id, skipped)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestScrubString(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret}}})
	in := "GET /x?k=" + strings.ReplaceAll(knownSecret, "/", "%2F") + " host " + awsKey + " bob@corp.io"
	got := e.ScrubString(in)
	if strings.Contains(got, "xK9") || !strings.Contains(got, "[REDACTED:SECRET]") {
		t.Errorf("known value left: %q", got)
	}
	if !strings.Contains(got, awsKey) || !strings.Contains(got, "bob@corp.io") {
		t.Errorf("ScrubString acts on known values only: %q", got)
	}
	if got := e.ScrubString("nothing here"); got != "nothing here" {
		t.Errorf("changed: %q", got)
	}
}

// TestGitleaksKeywordFlood: a body made of a rule's keyword costs a
// bounded number of rule searches, and a token among the decoys is still
// found.
func TestGitleaksKeywordFlood(t *testing.T) {
	e := mustEngine(t, Config{})
	tok := truePositives()[0].value // SendGrid
	flood := strings.Repeat("SG.a ", 40000) + tok + " " + strings.Repeat("SG.b ", 40000)
	var runs int
	testGitleaksRun = func() { runs++ }
	defer func() { testGitleaksRun = nil }()
	out, rep := scrubText(t, e, ClassPublic, flood)
	if strings.Contains(out, tok) || len(rep.Findings()) != 1 {
		t.Errorf("the token among decoys: %d findings", len(rep.Findings()))
	}
	if limit := 4 * len(flood) / (glAfter / 2); runs > limit {
		t.Errorf("%d rule searches for %d bytes, want at most %d", runs, len(flood), limit)
	}
}
