package agents

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// fakeResponses is an OpenAI Responses API (HTTPS, SSE) that scripts one
// shell tool call. WebSocket upgrades are refused, as a server without that
// transport would; codex then falls back to HTTPS.
type fakeResponses struct {
	mu       sync.Mutex
	auths    []string
	paths    []string
	bodies   []string
	toolDone bool
}

func (f *fakeResponses) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	f.paths = append(f.paths, r.Method+" "+r.URL.Path+" "+r.Header.Get("Upgrade"))
	f.bodies = append(f.bodies, string(body))
	f.mu.Unlock()
	if r.Header.Get("Upgrade") != "" || r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/responses") {
		http.NotFound(w, r)
		return
	}
	conv := string(body)
	w.Header().Set("Content-Type", "text/event-stream")
	seq := 0
	ev := func(v map[string]any) {
		v["sequence_number"] = seq
		seq++
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", v["type"], b)
		w.(http.Flusher).Flush()
	}
	resp := map[string]any{"id": "resp_1", "object": "response", "status": "in_progress", "output": []any{}}
	ev(map[string]any{"type": "response.created", "response": resp})
	var item map[string]any
	switch {
	case strings.Contains(conv, `"type":"function_call_output"`) || strings.Contains(conv, `"type":"custom_tool_call_output"`):
		f.mu.Lock()
		f.toolDone = true
		f.mu.Unlock()
		item = map[string]any{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": "done", "annotations": []any{}}}}
	case strings.Contains(conv, "MAKE-THE-FILE"):
		// codex 0.169 exposes one code-mode tool, "exec" (JavaScript that
		// calls its nested tools, exec_command among them).
		js := `await tools.exec_command({cmd: "echo 'written by codex' > /work/made-by-codex.txt"});`
		item = map[string]any{"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "exec", "input": js, "status": "completed"}
	default:
		item = map[string]any{"type": "message", "id": "msg_0", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": "ok", "annotations": []any{}}}}
	}
	ev(map[string]any{"type": "response.output_item.added", "output_index": 0, "item": item})
	ev(map[string]any{"type": "response.output_item.done", "output_index": 0, "item": item})
	resp["status"], resp["output"] = "completed", []any{item}
	resp["usage"] = map[string]any{"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
		"input_tokens_details": map[string]int{"cached_tokens": 0}, "output_tokens_details": map[string]int{"reasoning_tokens": 0}}
	ev(map[string]any{"type": "response.completed", "response": resp})
}

// TestCodexToolCallVM: the real codex runs `exec` in the VM as the agent
// user against a fake Responses API through the proxy, with its placeholder
// key swapped for the real one, and runs the scripted shell call in /work.
func TestCodexToolCallVM(t *testing.T) {
	c, bin, _ := agentHome(t, "codex")
	fake := &fakeResponses{}
	port, caFile := clitest.ServeTLS(t, fake, "api.openai.com")
	realKey := "sk-proj-" + strings.Repeat("RealOpenAIKey0", 8) // gitleaks:allow
	c.Env = append(c.Env, "OPENAI_API_KEY="+realKey)
	ws := clitest.SampleWorkspace(t)
	stdout, stderr, code := c.RunWith(t, bin, "", "run", ws, "--agent", "codex", "--preflight=off", "--apply",
		"--allow", "127.0.0.1:*", "--resolve", "api.openai.com:443:127.0.0.1:"+port, "--ca-file", caFile,
		"--", "exec", "--skip-git-repo-check", "MAKE-THE-FILE in /work, then say done")
	fake.mu.Lock()
	defer fake.mu.Unlock()
	t.Logf("requests: %v", fake.paths)
	if !fake.toolDone {
		for i, b := range fake.bodies {
			names := regexp.MustCompile(`"(?:type|name)":"[^"]*"`).FindAllString(b, 200)
			t.Logf("body %d: %d bytes; %s", i, len(b), strings.Join(names, " "))
		}
	}
	if code != 0 {
		t.Fatalf("codex: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for i, a := range fake.auths {
		if a != "" && a != "Bearer "+realKey {
			t.Errorf("request %d: Authorization %.20q…, want the real key", i, a)
		}
	}
	if !fake.toolDone {
		t.Errorf("codex never sent the tool's output back\n%s\n%s", stdout, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "made-by-codex.txt")); err != nil || string(b) != "written by codex\n" {
		t.Errorf("the agent's file after apply: %q %v", b, err)
	}
}
