package session

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSandboxNoteInInstructionsFile writes the sandbox note into a guest
// home over the guest agent's own SFTP server (in process, the transport a
// session uses): the user's instructions copied in before are kept, the
// note is added once however often the session is attached or resumed,
// and an agent without an instructions file gets one.
func TestSandboxNoteInInstructionsFile(t *testing.T) {
	c := inProcessGuest(t)
	sc, err := c.SFTP()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	note := SandboxNote("proj")

	t.Run("the user's file is kept", func(t *testing.T) {
		home := t.TempDir()
		rel := agentInstructions["claude"]
		user := "# My rules\n\nUse tabs. <!-- vibedom -->\nNever push." // no final newline
		mustWrite(t, filepath.Join(home, rel), user)
		for i := range 3 { // start, attach, resume
			wrote, err := appendSandboxNote(sc, home, rel, note)
			if err != nil {
				t.Fatal(err)
			}
			if wrote != (i == 0) {
				t.Fatalf("call %d: wrote = %v", i, wrote)
			}
		}
		got := mustRead(t, filepath.Join(home, rel))
		if want := user + "\n\n" + sandboxNoteMark + "\n" + note; got != want {
			t.Fatalf("instructions file:\n%s\nwant:\n%s", got, want)
		}
		if n := strings.Count(got, sandboxNoteMark); n != 1 {
			t.Fatalf("the note is there %d times", n)
		}
		if !strings.Contains(got, "vibedom allow proj HOST") {
			t.Fatalf("the note does not say how to allow a name:\n%s", got)
		}
	})

	for agent, rel := range agentInstructions {
		t.Run("no file: "+agent, func(t *testing.T) {
			home := t.TempDir()
			for range 2 {
				if _, err := appendSandboxNote(sc, home, rel, note); err != nil {
					t.Fatal(err)
				}
			}
			dst := filepath.Join(home, rel)
			if got := mustRead(t, dst); got != sandboxNoteMark+"\n"+note {
				t.Fatalf("%s:\n%s", rel, got)
			}
			fi, err := os.Stat(dst)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Fatalf("%s is %v, want 0600 (the agent's own)", rel, fi.Mode().Perm())
			}
		})
	}
}

func mustWrite(t *testing.T, name, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
