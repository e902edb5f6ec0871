package subscriptions

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/e2e/clitest"
)

// chatgptJWT is a JWT-shaped token with codex's claims, expiring at exp.
func chatgptJWT(exp time.Time) string {
	h, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT"})
	p, _ := json.Marshal(map[string]any{"email": "dev@example.com", "exp": exp.Unix(), "iat": time.Now().Unix(),
		"https://api.openai.com/auth": map[string]any{"chatgpt_plan_type": "pro", "chatgpt_account_id": "acct-123", "chatgpt_user_id": "user-9"}})
	return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p) + "." + oauthTok("")[:86]
}

// fakeChatGPT is the ChatGPT backend (the Responses API under
// /backend-api/codex, clitest.FakeResponses) and auth.openai.com's token endpoint,
// told apart by Host. Access tokens it issues last 1 second.
type fakeChatGPT struct {
	api      *clitest.FakeResponses
	mu       sync.Mutex
	refresh  string
	issued   map[string]bool
	bodies   []string
	accounts []string // ChatGPT-Account-Id of every API request
	auths    []string // Authorization of every API request
	paths    []string
}

// accountsCheck is the workspace discovery codex 0.169 waits for in
// ChatGPT mode: one personal workspace, requests kept on chatgpt.com.
const accountsCheck = `{"accounts":[{"id":"acct-123","account_id":"acct-123","structure":"personal","plan_type":"pro",` +
	`"name":"dev","is_deactivated":false,"workspace_backend_origin":"NO_CONSTRAINT","account_routing_override":"NO_CONSTRAINT",` +
	`"can_access_with_session":true}],"default_account_id":"acct-123","account_ordering":["acct-123"]}`

func (f *fakeChatGPT) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.Host, "auth.openai.com") {
		f.mu.Lock()
		f.accounts = append(f.accounts, r.Header.Get("ChatGPT-Account-Id"))
		f.auths = append(f.auths, r.Header.Get("Authorization"))
		f.paths = append(f.paths, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		if r.URL.Path == "/backend-api/wham/accounts/check" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, accountsCheck)
			return
		}
		if ce := r.Header.Get("Content-Encoding"); ce != "" {
			// codex compresses its requests to the ChatGPT backend.
			dec, err := zstd.NewReader(r.Body)
			if ce != "zstd" || err != nil {
				http.Error(w, "unknown content encoding "+ce, http.StatusBadRequest)
				return
			}
			defer dec.Close()
			r.Body = io.NopCloser(dec)
			r.Header.Del("Content-Encoding")
		}
		f.api.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bodies = append(f.bodies, string(body))
	var req map[string]string
	json.Unmarshal(body, &req)
	if r.URL.Path != "/oauth/token" || req["refresh_token"] != f.refresh {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"code":"refresh_token_reused"}}`)
		return
	}
	access := chatgptJWT(time.Now().Add(time.Second))
	f.refresh = oauthTok("rt_")
	f.issued[access] = true
	json.NewEncoder(w).Encode(map[string]any{"access_token": access, "refresh_token": f.refresh,
		"id_token": chatgptJWT(time.Now().Add(time.Hour))})
}

// TestCodexSubscriptionLoginVM (issue 21): the real codex runs `exec` in
// the VM logged in with a placeholder ChatGPT auth.json (imported from the
// host's ~/.codex/auth.json), against a fake ChatGPT backend and token
// endpoint on loopback TLS; the backend sees only access tokens the token
// endpoint issued to the host's refreshes (each lasts a second, so the
// host refreshes between calls), with the account id; the token endpoint
// sees only the host; no real token is in a log, session file or the
// workspace.
func TestCodexSubscriptionLoginVM(t *testing.T) {
	arch, _ := agents.GuestArch(runtime.GOARCH)
	p, err := agents.Lookup("codex", arch, agents.LibcGlibc)
	if err != nil {
		t.Fatal(err)
	}
	reg := agentstest.Serve(t, map[agents.Pin]string{p: agentstest.Tarball(t, p)})
	c, bin := clitest.GuestImageHome(t, "--agents", "codex", "--registry", reg.URL)

	imported, importedRefresh := chatgptJWT(time.Now().Add(time.Minute)), oauthTok("rt_")
	fake := &fakeChatGPT{api: &clitest.FakeResponses{}, refresh: importedRefresh, issued: map[string]bool{}}
	port, caFile := clitest.ServeTLS(t, fake, "chatgpt.com", "auth.openai.com")

	hostHome := t.TempDir()
	doc, _ := json.Marshal(map[string]any{"OPENAI_API_KEY": nil, "tokens": map[string]any{"id_token": chatgptJWT(time.Now().Add(time.Hour)),
		"access_token": imported, "refresh_token": importedRefresh, "account_id": "acct-123"},
		"last_refresh": time.Now().UTC().Format(time.RFC3339)})
	os.MkdirAll(filepath.Join(hostHome, ".codex"), 0o700)
	os.WriteFile(filepath.Join(hostHome, ".codex", "auth.json"), doc, 0o600)
	c.Env = append(c.Env, "HOME="+hostHome, "OPENAI_API_KEY=", "CODEX_HOME=")
	if stdout, stderr, code := c.RunWith(t, bin, "", "auth", "import", "codex"); code != 0 {
		t.Fatalf("auth import: %d %s %s", code, stdout, stderr)
	}
	ws := clitest.SampleWorkspace(t)
	stdout, stderr, code := c.RunWith(t, bin, "", "run", ws, "--agent", "codex", "--preflight=off", "--apply",
		"--allow", "127.0.0.1:*", "--resolve", "chatgpt.com:443:127.0.0.1:"+port,
		"--resolve", "auth.openai.com:443:127.0.0.1:"+port, "--ca-file", caFile,
		"--", "exec", "--skip-git-repo-check", "MAKE-THE-FILE in /work, then say done")
	fake.api.Mu.Lock()
	toolDone := fake.api.ToolDone
	fake.api.Mu.Unlock()
	fake.mu.Lock()
	defer fake.mu.Unlock()
	auths, paths := fake.auths, fake.paths
	t.Logf("requests: %v\nhost refreshes: %d", paths, len(fake.bodies))
	if code != 0 {
		t.Fatalf("codex: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !toolDone {
		t.Errorf("codex never sent the tool's output back\n%s\n%s", stdout, stderr)
	}
	distinct := map[string]bool{}
	for i, a := range auths {
		tok := strings.TrimPrefix(a, "Bearer ")
		if !fake.issued[tok] {
			t.Errorf("request %d (%s): Authorization %.24q…, not a token the host got from the token endpoint", i, paths[i], a)
		}
		if strings.Contains(paths[i], "/responses") {
			distinct[tok] = true
		}
		if fake.accounts[i] != "acct-123" {
			t.Errorf("request %d: ChatGPT-Account-Id %q", i, fake.accounts[i])
		}
	}
	if len(distinct) < 2 {
		t.Errorf("%d distinct real tokens on model calls: the host did not refresh between them", len(distinct))
	}
	for i, b := range fake.bodies {
		if !strings.Contains(b, `"refresh_token":"rt_`) {
			t.Errorf("token request %d is not the host's: %s", i, b)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, "made-by-codex.txt")); err != nil || string(b) != "written by codex\n" {
		t.Errorf("the agent's file after apply: %q %v", b, err)
	}
	reals := []string{imported, importedRefresh, fake.refresh}
	for tok := range fake.issued {
		reals = append(reals, tok)
	}
	for _, dir := range []string{filepath.Join(c.Home, "logs"), filepath.Join(c.Home, "sessions"), ws} {
		filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() {
				return nil
			}
			b, _ := os.ReadFile(path)
			for _, r := range reals {
				if strings.Contains(string(b), strings.Split(r, ".")[len(strings.Split(r, "."))-1]) {
					t.Errorf("%s holds a real token", path)
					break
				}
			}
			return nil
		})
	}
}
