package preflight

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// leakyTree writes a workspace holding secrets of every shape the outputs
// handle differently, including ones placed where a careless output would
// echo them: in a host name, in .gitleaksignore and in the approvals file.
// It returns the secrets.
func leakyTree(t *testing.T, ws string) []string {
	t.Helper()
	short := "ab:" + "Xk9mQ2" // under 12 characters: no prefix shown
	subdomain := githubPAT("5")
	writeTree(t, ws, map[string]string{
		"src/aws.py":     "key = '" + awsKey() + "'\n",
		"billing/pay.py": "stripe.api_key = \"" + stripeLive() + "\"\n",
		"keys/id_rsa":    pemKey(),
		".env":           envPassword(passValue),
		"app.env":        "GITHUB_TOKEN=" + githubPAT("1") + "\n",
		"svc.sh":         "export SVC_URL=https://" + subdomain + ".localhost/api\n",
		"short.sh":       "cu" + "rl -u " + short + " https://api.acme.io\n",
		// A secret pasted into the ignore file by mistake: a bad line.
		IgnoreFile: githubPAT("1") + "\n",
		// And one pasted into the approvals file in place of a hash.
		ApprovalsFile: "app.env:github-pat:1\t" + githubPAT("1") + "\n",
	})
	return []string{awsKey(), stripeLive(), pemKey(), passValue, githubPAT("1"), subdomain, "ab:Xk9mQ2"}
}

// leaks returns what of secret out holds: the secret itself (in any case),
// or a piece of it beyond what redaction may show (the 4-character prefix).
func leaks(out, secret string) string {
	pieces := []string{secret, strings.ToLower(secret), strings.ToUpper(secret)}
	if len(secret) >= 12 {
		pieces = append(pieces, secret[4:12], secret[len(secret)-8:])
	} else {
		pieces = append(pieces, secret[len(secret)-5:])
	}
	for _, p := range pieces {
		if strings.Contains(out, p) {
			return p
		}
	}
	return ""
}

// TestNoOutputHoldsASecret drives every output the package has — the JSON
// report (marshalled and written), the text report, the review in every
// mode and every answer, the strict error, warnings, the logger at debug
// level, a failed approval's error, the approvals file and the cache — and
// greps each for the generated secrets.
func TestNoOutputHoldsASecret(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	secrets := leakyTree(t, e.ws)
	var logs bytes.Buffer
	opts := e.opts()
	opts.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	scan := func() *Report {
		t.Helper()
		r, err := Scan(t.Context(), opts)
		must(t, err)
		return r
	}
	r := scan()
	if n := len(r.Findings); n < len(secrets) {
		t.Fatalf("setup: %d findings, want at least %d:\n%s", n, len(secrets), fileList(r))
	}
	if len(r.Warnings) < 2 {
		t.Fatalf("setup: want warnings for the bad ignore and approvals lines, got %q", r.Warnings)
	}

	outputs := map[string]string{}
	js, err := json.Marshal(r)
	must(t, err)
	outputs["MarshalJSON"] = string(js)
	reportPath := filepath.Join(t.TempDir(), "gitleaks_report.json")
	must(t, r.WriteJSON(reportPath))
	b, err := os.ReadFile(reportPath)
	must(t, err)
	outputs["WriteJSON"] = string(b)
	var text bytes.Buffer
	must(t, r.WriteText(&text))
	outputs["WriteText"] = text.String()
	outputs["Warnings"] = strings.Join(r.Warnings, "\n")
	for _, f := range r.Findings {
		outputs["Finding "+f.Fingerprint] = fmt.Sprintf("%v %+v %#v %s %q", f, f, f, f, f) + f.Reason + f.Redacted()
	}

	for _, mode := range []Mode{ModeWarn, ModeStrict, ModePrompt, ModeOff} {
		var out bytes.Buffer
		_, err := Review(t.Context(), r, strings.NewReader(""), &out, false, mode)
		outputs["Review "+mode.String()] = out.String() + fmt.Sprint(err)
	}
	for _, answers := range []string{"x\n", "c\n", "what\ni\n0\n99\nabc\n\nx\n", ""} {
		var out bytes.Buffer
		_, err := Review(t.Context(), scan(), strings.NewReader(answers), &out, true, ModePrompt)
		outputs[fmt.Sprintf("Review prompt %q", answers)] = out.String() + fmt.Sprint(err)
	}
	// A failed approval's error is shown in the prompt.
	must(t, os.Rename(filepath.Join(e.ws, ".vibedom"), filepath.Join(e.ws, ".vibedom.bak")))
	must(t, os.WriteFile(filepath.Join(e.ws, ".vibedom"), nil, 0o644))
	var failed bytes.Buffer
	_, err = Review(t.Context(), scan(), strings.NewReader("a\nc\n"), &failed, true, ModePrompt)
	outputs["Review prompt, approvals not writable"] = failed.String() + fmt.Sprint(err)
	must(t, os.Remove(filepath.Join(e.ws, ".vibedom")))
	must(t, os.Rename(filepath.Join(e.ws, ".vibedom.bak"), filepath.Join(e.ws, ".vibedom")))
	// Approving writes the approvals file.
	var approved bytes.Buffer
	_, err = Review(t.Context(), scan(), strings.NewReader("i\n1,2\na\n"), &approved, true, ModePrompt)
	outputs["Review prompt approving"] = approved.String() + fmt.Sprint(err)
	if !strings.Contains(approved.String(), "Approved") {
		t.Errorf("setup: nothing approved:\n%s", approved.String())
	}
	after := scan()
	must(t, after.approve(after.Unapproved()))
	b, err = os.ReadFile(filepath.Join(e.ws, ApprovalsFile))
	must(t, err)
	// The line pasted by mistake is kept verbatim (it is the user's); what
	// vibedom wrote must hold no secret.
	outputs["approvals file (what vibedom wrote)"] = strings.Replace(string(b), "app.env:github-pat:1\t"+githubPAT("1")+"\n", "", 1)
	outputs["logs"] = logs.String()
	must(t, filepath.WalkDir(e.cache, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		outputs["cache "+d.Name()] = string(b)
		return err
	}))
	if strings.TrimSpace(outputs["logs"]) == "" {
		t.Error("setup: the logger got nothing")
	}

	for name, out := range outputs {
		for i, s := range secrets {
			if p := leaks(out, s); p != "" {
				t.Errorf("%s holds secret %d (%q):\n%s", name, i, p, out)
			}
		}
	}
}
