package agents

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestCodexToolCallVM: the real codex runs `exec` in the VM as the agent
// user against a fake Responses API through the proxy, with its placeholder
// key swapped for the real one, and runs the scripted shell call in /work.
func TestCodexToolCallVM(t *testing.T) {
	c, bin, _ := agentHome(t, "codex")
	fake := &clitest.FakeResponses{}
	port, caFile := clitest.ServeTLS(t, fake, "api.openai.com")
	realKey := "sk-proj-" + strings.Repeat("RealOpenAIKey0", 8) // gitleaks:allow
	c.Env = append(c.Env, "OPENAI_API_KEY="+realKey)
	ws := clitest.SampleWorkspace(t)
	stdout, stderr, code := c.RunWith(t, bin, "", "run", ws, "--agent", "codex", "--preflight=off", "--apply",
		"--allow", "127.0.0.1:*", "--resolve", "api.openai.com:443:127.0.0.1:"+port, "--ca-file", caFile,
		"--", "exec", "--skip-git-repo-check", "MAKE-THE-FILE in /work, then say done")
	fake.Mu.Lock()
	defer fake.Mu.Unlock()
	t.Logf("requests: %v", fake.Paths)
	if !fake.ToolDone {
		for i, b := range fake.Bodies {
			names := regexp.MustCompile(`"(?:type|name)":"[^"]*"`).FindAllString(b, 200)
			t.Logf("body %d: %d bytes; %s", i, len(b), strings.Join(names, " "))
		}
	}
	if code != 0 {
		t.Fatalf("codex: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for i, a := range fake.Auths {
		if a != "" && a != "Bearer "+realKey {
			t.Errorf("request %d: Authorization %.20q…, want the real key", i, a)
		}
	}
	if !fake.ToolDone {
		t.Errorf("codex never sent the tool's output back\n%s\n%s", stdout, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "made-by-codex.txt")); err != nil || string(b) != "written by codex\n" {
		t.Errorf("the agent's file after apply: %q %v", b, err)
	}
}
