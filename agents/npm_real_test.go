package agents_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
)

// The real Gemini CLI tarball (npm pack'd into .cache/npm), served by a
// local registry, installed as the named agent with its compiled-in pin,
// and run with the host's node when there is one.
func TestInstallGeminiReal(t *testing.T) {
	reg := agentstest.ServeNPM(t, agentstest.GeminiTarball(t))
	home := t.TempDir()
	name, spec, integ, err := agents.NodeRequest("gemini", true)
	if err != nil {
		t.Fatal(err)
	}
	if reg.Integrity[spec.Name+"@"+spec.Version] != integ {
		t.Fatalf("the packed tarball hashes to %s, the pin is %s", reg.Integrity[spec.Name+"@"+spec.Version], integ)
	}
	res, err := agents.InstallNPM(t.Context(), agents.Options{Home: home, Registry: reg.URL}, name, spec, integ)
	if err != nil {
		t.Fatal(err)
	}
	if res.Binary != "package/node_modules/@google/gemini-cli/bundle/gemini.js" || res.Runtime != agents.RuntimeNode {
		t.Fatalf("installed %+v", res.Manifest)
	}
	i, err := agents.FindNode(home, "gemini")
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node on the host to run it with")
	}
	out, err := exec.Command(node, i.BinaryPath(), "--version").CombinedOutput()
	if err != nil && strings.Contains(string(out), "SyntaxError") {
		t.Skipf("the host's node is too old for Gemini CLI: %s", out)
	}
	if err != nil || strings.TrimSpace(string(out)) != spec.Version {
		t.Fatalf("gemini --version: %v %q", err, out)
	}
}
