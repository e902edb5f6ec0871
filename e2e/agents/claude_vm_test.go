package agents

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// fakeAnthropic is a Messages API that scripts one tool call: asked with
// the marker, it answers with a Write tool_use; given the tool's result, it
// ends the turn. Everything else gets a short text.
type fakeAnthropic struct {
	mu       sync.Mutex
	first    time.Time // the first request
	keys     []string  // x-api-key of every request
	auths    []string
	paths    []string
	bodies   []string
	toolDone bool
}

func (f *fakeAnthropic) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	if f.first.IsZero() {
		f.first = time.Now()
	}
	f.keys = append(f.keys, r.Header.Get("X-Api-Key"))
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	f.paths = append(f.paths, r.Method+" "+r.URL.Path)
	f.bodies = append(f.bodies, string(body))
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
	last := string(body) // the conversation so far (prompt, tool results)
	var blocks []map[string]any
	stop := "end_turn"
	switch {
	case strings.Contains(last, "tool_result"):
		f.mu.Lock()
		f.toolDone = true
		f.mu.Unlock()
		blocks = []map[string]any{{"type": "text", "text": "done"}}
	case strings.Contains(last, "MAKE-THE-FILE"):
		stop = "tool_use"
		blocks = []map[string]any{{"type": "tool_use", "id": "toolu_01", "name": "Write",
			"input": map[string]any{"file_path": "/work/made-by-claude.txt", "content": "written by the agent\n"}}}
	default:
		blocks = []map[string]any{{"type": "text", "text": "ok"}}
	}
	if !req.Stream {
		json.NewEncoder(w).Encode(map[string]any{"id": "msg_1", "type": "message", "role": "assistant", "model": req.Model,
			"content": blocks, "stop_reason": stop, "usage": map[string]int{"input_tokens": 10, "output_tokens": 5}})
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
	for i, b := range blocks {
		if b["type"] == "tool_use" {
			in, _ := json.Marshal(b["input"])
			ev("content_block_start", map[string]any{"type": "content_block_start", "index": i,
				"content_block": map[string]any{"type": "tool_use", "id": b["id"], "name": b["name"], "input": map[string]any{}}})
			ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": i,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": string(in)}})
		} else {
			ev("content_block_start", map[string]any{"type": "content_block_start", "index": i,
				"content_block": map[string]any{"type": "text", "text": ""}})
			ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": i,
				"delta": map[string]any{"type": "text_delta", "text": b["text"]}})
		}
		ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	ev("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop}, "usage": map[string]int{"output_tokens": 5}})
	ev("message_stop", map[string]any{"type": "message_stop"})
}

// TestClaudeToolCallVM: the real Claude Code runs in the VM as the agent
// user (`vibedom run --agent claude -- -p …`), talks to a fake Messages API
// through the proxy with a placeholder key, which the proxy swaps for the
// real one; the API scripts a Write tool call, Claude executes it in /work,
// and the file comes back through the review and apply.
func TestClaudeToolCallVM(t *testing.T) {
	c, bin, _ := agentHome(t, "claude")

	fake := &fakeAnthropic{}
	port, caFile := clitest.ServeTLS(t, fake, "api.anthropic.com")

	realKey := "sk-ant-api03-" + strings.Repeat("RealKey0", 11) + "-AAAA" // gitleaks:allow
	c.Env = append(c.Env, "ANTHROPIC_API_KEY="+realKey)
	ws := clitest.SampleWorkspace(t)
	start := time.Now()
	stdout, stderr, code := c.RunWith(t, bin, "", "run", ws, "--agent", "claude", "--preflight=off", "--apply",
		"--allow", "127.0.0.1:*", "--resolve", "api.anthropic.com:443:127.0.0.1:"+port, "--ca-file", caFile,
		"--", "-p", "MAKE-THE-FILE in /work, then say done")
	fake.mu.Lock()
	keys, auths, paths, toolDone := append([]string(nil), fake.keys...), append([]string(nil), fake.auths...), append([]string(nil), fake.paths...), fake.toolDone
	fake.mu.Unlock()
	if code != 0 {
		t.Fatalf("claude: exit %d\nrequests: %v\nstdout:\n%s\nstderr:\n%s", code, paths, stdout, stderr)
	}
	t.Logf("claude said: %s\nrequests: %v", strings.TrimSpace(stdout), paths)
	fake.mu.Lock()
	t.Logf("from `vibedom run` to Claude's first API request: %s (the session was ready %s)",
		fake.first.Sub(start).Round(10*time.Millisecond), readyLine(stderr))
	fake.mu.Unlock()
	if len(keys) == 0 {
		t.Fatalf("the fake API got no request")
	}
	for i, k := range keys {
		if k != realKey && !(k == "" && auths[i] == "") {
			t.Errorf("request %d (%s): x-api-key %.16q…, want the real key", i, paths[i], k)
		}
		if strings.Contains(auths[i], "sk-ant") && !strings.Contains(auths[i], realKey) {
			t.Errorf("request %d: a placeholder in Authorization", i)
		}
	}
	if !toolDone {
		t.Errorf("claude never sent the tool's result back")
	}
	if b, err := os.ReadFile(filepath.Join(ws, "made-by-claude.txt")); err != nil || string(b) != "written by the agent\n" {
		t.Errorf("the agent's file after apply: %q %v", b, err)
	}
	// The logs show the calls, never the key.
	logs, _ := filepath.Glob(filepath.Join(c.Home, "logs", "*", "*.jsonl"))
	var network string
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if strings.Contains(string(b), realKey) {
			t.Errorf("%s holds the real key", l)
		}
		if strings.HasSuffix(l, "network.jsonl") {
			network += string(b)
		}
	}
	if !strings.Contains(network, "api.anthropic.com") {
		t.Errorf("network.jsonl does not show the API calls")
	}
	// The guest never sees the real key: its environment, every process's,
	// and the files it could have been written to.
	check := `env; cat /proc/*/environ 2>/dev/null | tr '\0' '\n'; grep -rlF "$1" /etc /home /root /tmp /run /work /opt 2>/dev/null; echo END`
	stdout, stderr, code = c.RunWith(t, bin, "", "run", ws, "--preflight=off", "--no-review", "--root", "--allow", "127.0.0.1:*",
		"--", "sh", "-c", check, "sh", realKey[:40])
	if code != 0 || !strings.Contains(stdout, "END") {
		t.Fatalf("guest check: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if strings.Contains(stdout, realKey[13:]) {
		t.Errorf("the real key is in the guest:\n%s", stdout)
	}
	if !strings.Contains(stdout, "ANTHROPIC_API_KEY=sk-ant-api03-") {
		t.Errorf("the guest has no placeholder:\n%s", stdout)
	}
}

// readyLine is the session's "ready in …" figure from its progress output.
func readyLine(stderr string) string {
	if i := strings.Index(stderr, "ready in "); i >= 0 {
		rest := stderr[i+len("ready in "):]
		if j := strings.IndexByte(rest, '\n'); j >= 0 {
			rest = rest[:j]
		}
		return "in " + rest
	}
	return "(no ready line)"
}
