package session

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/vm"
)

// A node agent's session command is the image's node running its bin
// script from the agent layer, with its flags, then the user's words; its
// layer image is built from the verified directory; a tampered install is
// refused before anything is built.
func TestPrepareNodeAgent(t *testing.T) {
	reg := agentstest.ServeNPM(t, agentstest.GeminiTarball(t))
	h := t.TempDir()
	name, spec, integ, _ := agents.NodeRequest("gemini", true)
	res, err := agents.InstallNPM(context.Background(), agents.Options{Home: h, Registry: reg.URL}, name, spec, integ)
	if err != nil {
		t.Fatal(err)
	}
	newSess := func() *sess {
		return &sess{opts: Options{Home: home.Home(h), Arch: vm.ArchAMD64, Agent: &AgentOptions{Name: "gemini", Args: []string{"-p", "hi"}}},
			rootImage: "root.ext4", guestLibc: agents.LibcMusl, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	}
	s := newSess()
	if err := s.prepareAgent(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{"/usr/bin/node", proto.AgentMount + "/package/node_modules/@google/gemini-cli/bundle/gemini.js", "--yolo", "-p", "hi"}
	if !slices.Equal(s.plan.command, want) {
		t.Errorf("command %q, want %q", s.plan.command, want)
	}
	if len(s.layers) != 1 || s.layers[0].path != res.Dir+".ext4" || s.layers[0].mount != proto.AgentMount {
		t.Fatalf("layers %+v", s.layers)
	}
	if st, err := os.Stat(s.layers[0].path); err != nil || st.Size() == 0 {
		t.Fatalf("layer image: %v", err)
	}
	// Tampered after init: refused at run, with what to do.
	js := filepath.Join(res.Dir, "package/node_modules/@google/gemini-cli/bundle/gemini.js")
	os.Chmod(filepath.Dir(js), 0o755)
	os.Chmod(js, 0o644)
	if err := os.WriteFile(js, []byte("process.exit(0)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s = newSess()
	err = s.prepareAgent(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no longer match the lock") || len(s.plan.command) != 0 {
		t.Fatalf("tampered: %v, command %q", err, s.plan.command)
	}
}
