package clitest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// FakeResponses is a fake OpenAI Responses API (HTTPS, SSE) that scripts one
// shell tool call. WebSocket upgrades are refused, as a server without that
// transport would; codex then falls back to HTTPS.
type FakeResponses struct {
	Mu       sync.Mutex // guards the fields below
	Auths    []string   // each request's Authorization header
	Paths    []string   // each request's method, path and Upgrade header
	Bodies   []string   // each request's body
	ToolDone bool       // a request carried the tool call's output
}

func (f *FakeResponses) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.Mu.Lock()
	f.Auths = append(f.Auths, r.Header.Get("Authorization"))
	f.Paths = append(f.Paths, r.Method+" "+r.URL.Path+" "+r.Header.Get("Upgrade"))
	f.Bodies = append(f.Bodies, string(body))
	f.Mu.Unlock()
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
		f.Mu.Lock()
		f.ToolDone = true
		f.Mu.Unlock()
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
