package preflight

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Secret-looking fixture values are assembled at run time, so this
// repository's own files hold none (vibedom's preflight scans itself).

func awsKey() string     { return "AKIA" + "Z7QH2LXK4MN3PW5R" }
func awsKeyNext() string { return "AKIA" + "Q4MZ7WX2RT5PLK3N" }

// githubPAT varies in its last character so tests can make distinct ones.
func githubPAT(last string) string {
	return "ghp" + "_aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA" + last
}

func stripeLive() string { return "sk" + "_live_" + "4eC39HqLyjWDarjtT1zdp7dc" }

func pemKey() string {
	return "-----BEGIN " + "RSA PRIVATE KEY-----\n" +
		"MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw\n" +
		"7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxKLxoS2tFc\n" +
		"-----END " + "RSA PRIVATE KEY-----\n"
}

// envPassword is a line the generic-api-key rule reports, with value v.
func envPassword(v string) string { return "DB_PASS" + "WORD=" + v + "\n" }

const passValue = "hQ7vR2mZ9xL4pK8wT3"

// writeTree writes files (relative slash paths → contents) under dir.
func writeTree(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for rel, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// env is one test's workspace plus the per-user state a scan needs.
type env struct {
	ws, cache, key string
}

func newEnv(t testing.TB) env {
	t.Helper()
	home := t.TempDir()
	return env{
		ws:    t.TempDir(),
		cache: filepath.Join(home, "cache", "preflight"),
		key:   filepath.Join(home, "keys", "preflight_approvals.key"),
	}
}

func (e env) opts() Options {
	return Options{Workspace: e.ws, CacheDir: e.cache, ApprovalKeyPath: e.key}
}

func (e env) scan(t testing.TB) *Report {
	t.Helper()
	r, err := Scan(t.Context(), e.opts())
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return r
}

// byFile indexes findings by "file rule" for assertions.
func byFile(r *Report) map[string]Finding {
	m := map[string]Finding{}
	for _, f := range r.Findings {
		m[f.File+" "+f.RuleID] = f
	}
	return m
}

func fileList(r *Report) string {
	var s []string
	for _, f := range r.Findings {
		s = append(s, f.File+" "+f.RuleID+" "+f.Risk.String()+" "+f.Status.String())
	}
	return strings.Join(s, "\n")
}
