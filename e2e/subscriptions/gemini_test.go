package subscriptions

import (
	"bufio"
	"encoding/json"
	"fmt"
	"github.com/vibedom/vibedom/e2e/clitest"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
)

// fakeGemini is a Gemini API (generativelanguage.googleapis.com, v1beta)
// that scripts one tool call: asked with the marker, it answers with a
// write_file functionCall for file; given the functionResponse, it ends
// the turn. Everything else gets a short text.
type fakeGemini struct {
	file     string // the absolute path write_file is told to write
	mu       sync.Mutex
	keys     []string // x-goog-api-key of every request
	queries  []string // ?key= of every request (must stay empty)
	paths    []string
	toolDone bool
}

func (f *fakeGemini) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.keys = append(f.keys, r.Header.Get("X-Goog-Api-Key"))
	f.queries = append(f.queries, r.URL.Query().Get("key"))
	f.paths = append(f.paths, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	_, op, _ := strings.Cut(r.URL.Path, ":")
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1beta/models/") {
		http.NotFound(w, r)
		return
	}
	if op == "countTokens" {
		io.WriteString(w, `{"totalTokens":10}`)
		return
	}
	// The last turn decides: a tool's result, the marker, or anything else.
	var req struct {
		Contents []struct {
			Role  string            `json:"role"`
			Parts []json.RawMessage `json:"parts"`
		} `json:"contents"`
	}
	json.Unmarshal(body, &req)
	last := ""
	if n := len(req.Contents); n > 0 {
		b, _ := json.Marshal(req.Contents[n-1])
		last = string(b)
	}
	var part map[string]any
	switch {
	case strings.Contains(string(body), `"application/json"`):
		// Gemini CLI's side questions (model routing, next speaker,
		// loop checks) ask for JSON.
		part = map[string]any{"text": `{"reasoning":"done","next_speaker":"user","complexity_reasoning":"simple","complexity_score":1}`}
	case strings.Contains(last, "functionResponse"):
		f.mu.Lock()
		f.toolDone = true
		f.mu.Unlock()
		part = map[string]any{"text": "done"}
	case strings.Contains(last, "MAKE-THE-FILE"):
		part = map[string]any{"functionCall": map[string]any{"name": "write_file",
			"args": map[string]any{"file_path": f.file, "content": "written by the agent\n"}}}
	default:
		part = map[string]any{"text": "ok"}
	}
	resp := map[string]any{"candidates": []any{map[string]any{"index": 0, "finishReason": "STOP",
		"content": map[string]any{"role": "model", "parts": []any{part}}}},
		"usageMetadata": map[string]int{"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
		"modelVersion":  "gemini-fake"}
	b, _ := json.Marshal(resp)
	if op == "streamGenerateContent" {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\r\n\r\n", b)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// connectTo is an HTTP CONNECT proxy that sends every tunnel to addr:
// on the host it stands where vibedom's proxy (and --resolve) stand in
// the guest.
func connectTo(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil || req.Method != http.MethodConnect || !strings.HasPrefix(req.Host, "generativelanguage.googleapis.com:") {
					io.WriteString(c, "HTTP/1.1 403 Forbidden\r\n\r\n")
					return
				}
				up, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer up.Close()
				io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n")
				go io.Copy(up, br)
				io.Copy(c, up)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// TestGeminiToolCallHost: the real Gemini CLI, installed by vibedom from
// a local registry, run with the host's node against the fake Gemini API
// (loopback TLS, its own CA): the API scripts a write_file call, Gemini
// executes it and sends the result back, and every request carried the
// key in x-goog-api-key. It checks the fake API the VM test needs; the
// guest's node is the host's here.
func TestGeminiToolCallHost(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node on the host")
	}
	if out, _ := exec.Command(node, "-e", "process.exit(+process.versions.node.split('.')[0] >= 20 ? 0 : 1)").CombinedOutput(); len(out) > 0 {
		t.Skipf("node: %s", out)
	} else if exec.Command(node, "-e", "process.exit(+process.versions.node.split('.')[0] >= 20 ? 0 : 1)").Run() != nil {
		t.Skip("the host's node is older than 20, which Gemini CLI needs")
	}
	reg := agentstest.ServeNPM(t, agentstest.GeminiTarball(t))
	home := t.TempDir()
	name, spec, integ, _ := agents.NodeRequest("gemini", true)
	res, err := agents.InstallNPM(t.Context(), agents.Options{Home: home, Registry: reg.URL}, name, spec, integ)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	fake := &fakeGemini{file: filepath.Join(work, "made-by-gemini.txt")}
	port, caFile := clitest.ServeTLS(t, fake, "generativelanguage.googleapis.com")
	proxy := connectTo(t, "127.0.0.1:"+port)

	key := "AIzaSyFAKE" + strings.Repeat("k", 29)
	cmd := exec.CommandContext(t.Context(), node, res.BinaryPath(), "--yolo", "-p", "MAKE-THE-FILE here, then say done")
	cmd.Dir = work
	ghome := t.TempDir()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + ghome, "GEMINI_API_KEY=" + key, "HTTPS_PROXY=" + proxy,
		"NODE_EXTRA_CA_CERTS=" + caFile, "TERM=dumb", "NO_COLOR=1"}
	for k, v := range agents.Env("gemini") {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		<-done
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	t.Logf("gemini: %v\n%s\nrequests: %v", err, out, fake.paths)
	if len(fake.keys) == 0 {
		t.Fatalf("the fake API got no request")
	}
	for i, k := range fake.keys {
		if k != key || fake.queries[i] != "" {
			t.Errorf("request %d (%s): x-goog-api-key %.12q…, ?key=%.8q", i, fake.paths[i], k, fake.queries[i])
		}
	}
	if !fake.toolDone {
		t.Errorf("gemini never sent the tool's result back")
	}
	if b, err := os.ReadFile(fake.file); err != nil || string(b) != "written by the agent\n" {
		t.Errorf("the file gemini wrote: %q %v", b, err)
	}
}
