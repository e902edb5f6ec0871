package subscriptions

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/e2e/clitest"
)

// oauthTok is a random token of Claude's shape, made at run time.
func oauthTok(prefix string) string {
	const a = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	b := make([]byte, 95)
	for i := range b {
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(len(a))))
		b[i] = a[n.Int64()]
	}
	return prefix + string(b)
}

// probeArg is a token fragment as the login probe takes it: base64 of the
// fragment reversed.
func probeArg(frag string) string {
	r := []byte(frag)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return base64.StdEncoding.EncodeToString(r)
}

// fakeClaudeCloud is Claude's API and token endpoint on one loopback TLS
// server, told apart by Host. The token endpoint rotates tokens (each
// refresh token valid once) and says every access token lasts 1 second,
// so the host refreshes before every API call. The API scripts one Bash
// tool call (the login probe) and records every Authorization it gets.
type fakeClaudeCloud struct {
	probeArgs  string // the fragments the probe looks for in the guest
	mu         sync.Mutex
	refresh    string          // the refresh token it accepts now
	issued     map[string]bool // access tokens it issued
	tokenBodys []string        // every token endpoint request body
	auths      []string        // Authorization of every API request
	paths      []string
	toolDone   bool
}

func (f *fakeClaudeCloud) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if strings.HasPrefix(r.Host, "platform.claude.com") {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.tokenBodys = append(f.tokenBodys, string(body))
		var req map[string]string
		json.Unmarshal(body, &req)
		if r.URL.Path != "/v1/oauth/token" || req["grant_type"] != "refresh_token" || req["refresh_token"] != f.refresh {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"invalid_grant"}`)
			return
		}
		access := oauthTok("sk-ant-oat01-")
		f.refresh = oauthTok("sk-ant-ort01-")
		f.issued[access] = true
		json.NewEncoder(w).Encode(map[string]any{"access_token": access, "refresh_token": f.refresh, "expires_in": 1,
			"scope": "user:inference user:profile user:sessions:claude_code", "token_type": "Bearer"})
		return
	}
	f.mu.Lock()
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	f.paths = append(f.paths, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1/messages") {
		http.NotFound(w, r)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/count_tokens") {
		io.WriteString(w, `{"input_tokens":10}`)
		return
	}
	var req struct {
		Stream bool   `json:"stream"`
		Model  string `json:"model"`
	}
	json.Unmarshal(body, &req)
	var block map[string]any
	stop := "end_turn"
	switch {
	case strings.Contains(string(body), "tool_result"):
		f.mu.Lock()
		f.toolDone = true
		f.mu.Unlock()
		block = map[string]any{"type": "text", "text": "done"}
	case strings.Contains(string(body), "LOGIN-ROUND-TRIP"):
		stop = "tool_use"
		block = map[string]any{"type": "tool_use", "id": "toolu_01", "name": "Bash",
			"input": map[string]any{"command": "/work/loginprobe " + f.probeArgs + " > /work/refresh-answer.json 2>&1", "description": "probe"}}
	default:
		block = map[string]any{"type": "text", "text": "ok"}
	}
	if !req.Stream {
		json.NewEncoder(w).Encode(map[string]any{"id": "msg_1", "type": "message", "role": "assistant", "model": req.Model,
			"content": []any{block}, "stop_reason": stop, "usage": map[string]int{"input_tokens": 10, "output_tokens": 5}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	ev := func(name string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		w.(http.Flusher).Flush()
	}
	ev("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_1", "type": "message",
		"role": "assistant", "model": req.Model, "content": []any{}, "stop_reason": nil, "usage": map[string]int{"input_tokens": 10, "output_tokens": 1}}})
	if block["type"] == "tool_use" {
		in, _ := json.Marshal(block["input"])
		ev("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "tool_use", "id": block["id"], "name": block["name"], "input": map[string]any{}}})
		ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": string(in)}})
	} else {
		ev("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "text", "text": ""}})
		ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": block["text"]}})
	}
	ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	ev("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop}, "usage": map[string]int{"output_tokens": 5}})
	ev("message_stop", map[string]any{"type": "message_stop"})
}

// TestClaudeSubscriptionLoginVM (issue 21): the real Claude Code runs in
// the VM logged in with placeholder subscription credentials (imported
// from the host's own ~/.claude/.credentials.json) and does a Bash tool
// round trip against a fake API; the fake API sees only real access
// tokens, each issued by the fake token endpoint to the host's own
// refreshes (the imported token is due at the start, and every new one
// lasts a second, so the token changes under the same placeholder between
// calls); the tool's command is the guest's own refresh, which gets
// placeholders from the proxy; the token endpoint never sees the guest;
// no real token is in the guest, a log or a session file.
func TestClaudeSubscriptionLoginVM(t *testing.T) {
	arch, _ := agents.GuestArch(runtime.GOARCH)
	p, err := agents.Lookup("claude", arch, agents.LibcGlibc)
	if err != nil {
		t.Fatal(err)
	}
	reg := agentstest.Serve(t, map[agents.Pin]string{p: agentstest.Tarball(t, p)})
	c, bin := clitest.GuestImageHome(t, "--agents", "claude", "--registry", reg.URL)

	imported, importedRefresh := oauthTok("sk-ant-oat01-"), oauthTok("sk-ant-ort01-")
	fake := &fakeClaudeCloud{refresh: importedRefresh, issued: map[string]bool{},
		probeArgs: probeArg(imported[13:40]) + " " + probeArg(importedRefresh[13:40])}
	port, caFile := clitest.ServeTLS(t, fake, "api.anthropic.com", "platform.claude.com")

	// The host's own Claude Code login, due for a refresh in a minute.
	hostHome := t.TempDir()
	doc, _ := json.Marshal(map[string]any{"claudeAiOauth": map[string]any{"accessToken": imported, "refreshToken": importedRefresh,
		"expiresAt": time.Now().Add(time.Minute).UnixMilli(), "scopes": []string{"user:inference", "user:profile", "user:sessions:claude_code"},
		"subscriptionType": "max", "rateLimitTier": "default_claude_max_20x"}})
	os.MkdirAll(filepath.Join(hostHome, ".claude"), 0o700)
	os.WriteFile(filepath.Join(hostHome, ".claude", ".credentials.json"), doc, 0o600)
	c.Env = append(c.Env, "HOME="+hostHome, "ANTHROPIC_API_KEY=", "CLAUDE_CONFIG_DIR=")
	if stdout, stderr, code := c.RunWith(t, bin, "", "auth", "import", "claude"); code != 0 {
		t.Fatalf("auth import: %d %s %s", code, stdout, stderr)
	}

	ws := clitest.SampleWorkspace(t)
	probe := exec.Command("go", "build", "-o", filepath.Join(ws, "loginprobe"), "./testdata/loginprobe")
	probe.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	stdout, stderr, code := c.RunWith(t, bin, "", "run", ws, "--agent", "claude", "--preflight=off", "--apply",
		"--allow", "127.0.0.1:*", "--resolve", "api.anthropic.com:443:127.0.0.1:"+port,
		"--resolve", "platform.claude.com:443:127.0.0.1:"+port, "--ca-file", caFile,
		"--", "-p", "LOGIN-ROUND-TRIP: run the probe, then say done")
	fake.mu.Lock()
	auths, paths, bodies, issued, toolDone := append([]string(nil), fake.auths...), append([]string(nil), fake.paths...),
		append([]string(nil), fake.tokenBodys...), fake.issued, fake.toolDone
	fake.mu.Unlock()
	if code != 0 {
		t.Fatalf("claude: exit %d\nrequests: %v\nstdout:\n%s\nstderr:\n%s", code, paths, stdout, stderr)
	}
	t.Logf("claude said: %s\nrequests: %v\nhost refreshes: %d", strings.TrimSpace(stdout), paths, len(bodies))
	if !toolDone {
		t.Errorf("claude never sent the tool's result back")
	}
	distinct := map[string]bool{}
	messages := 0
	for i, a := range auths {
		tok := strings.TrimPrefix(a, "Bearer ")
		if !issued[tok] {
			t.Errorf("request %d (%s): Authorization %.24q…, not a token the host got from the token endpoint", i, paths[i], a)
		}
		if strings.HasPrefix(paths[i], "POST /v1/messages") {
			messages++
			distinct[tok] = true
		}
	}
	if messages < 2 || len(distinct) < 2 {
		t.Errorf("%d model calls with %d distinct real tokens: the host did not refresh between calls", messages, len(distinct))
	}
	// The token endpoint saw the host's refreshes only: each with the
	// refresh token it had issued last (a guest's placeholder would break
	// the chain and be refused).
	for i, b := range bodies {
		if !strings.Contains(b, `"refresh_token":"sk-ant-ort01-`) || !strings.Contains(b, `"grant_type":"refresh_token"`) {
			t.Errorf("token request %d: %s", i, b)
		}
	}
	if len(bodies) < 2 {
		t.Errorf("the host refreshed %d times", len(bodies))
	}
	// The guest's own refresh got placeholders from the proxy.
	ans, err := os.ReadFile(filepath.Join(ws, "refresh-answer.json"))
	if err != nil {
		t.Fatalf("the probe's answer did not come back: %v", err)
	}
	var a map[string]any
	if json.Unmarshal(ans, &a) != nil || a["probe_status"] != float64(200) {
		t.Fatalf("the guest's refresh: %s", ans)
	}
	at, _ := a["access_token"].(string)
	rt, _ := a["refresh_token"].(string)
	sent, _ := a["probe_sent"].(string)
	if found, _ := a["probe_found"].([]any); len(found) > 0 || a["probe_searched"] != float64(2) {
		t.Errorf("the guest holds a real token: %v (searched %v)", found, a["probe_searched"])
	}
	if !strings.HasPrefix(at, "sk-ant-oat01-") || !strings.HasPrefix(rt, "sk-ant-ort01-") || issued[at] || rt == fake.refresh || sent == importedRefresh {
		t.Errorf("the guest's refresh answer is not placeholders: %s", ans)
	}
	// No real token anywhere: logs, session files, the workspace.
	fake.mu.Lock()
	reals := []string{imported, importedRefresh, fake.refresh}
	for tok := range fake.issued {
		reals = append(reals, tok)
	}
	fake.mu.Unlock()
	for _, dir := range []string{filepath.Join(c.Home, "logs"), filepath.Join(c.Home, "sessions"), ws} {
		filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() || strings.HasSuffix(path, ".ext4") || strings.HasSuffix(path, ".img") {
				return nil
			}
			b, _ := os.ReadFile(path)
			for _, r := range reals {
				if strings.Contains(string(b), r[13:]) {
					t.Errorf("%s holds a real token", path)
					break
				}
			}
			return nil
		})
	}
	if out, _ := exec.Command("grep", "-rlF", importedRefresh[13:], c.Home).CombinedOutput(); len(out) > 0 {
		// The store holds the real login by design; nothing else may.
		for _, f := range strings.Fields(string(out)) {
			if filepath.Base(f) != "claude.login" {
				t.Errorf("%s holds the imported refresh token", f)
			}
		}
	}
}
