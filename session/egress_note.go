package session

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"

	"github.com/pkg/sftp"

	"github.com/vibedom/vibedom/guest/proto"
)

// The sandbox note: a short text the guest carries outside the workspace,
// in /etc/vibedom/README and in the agent's own instructions file in its
// home (Claude Code ~/.claude/CLAUDE.md, Codex ~/.codex/AGENTS.md,
// OpenCode ~/.config/opencode/AGENTS.md, Gemini CLI ~/.gemini/GEMINI.md),
// telling the agent what the
// sandbox is and that a refused name is the user's decision, to be asked
// for rather than worked around. It is never written into the workspace,
// so it never shows in the change set.

// sandboxNoteMark starts the note in an instructions file; a file that
// already has it is left as it is.
const sandboxNoteMark = "<!-- vibedom sandbox note -->"

// maxNoteFile bounds the instructions file read back from the guest.
const maxNoteFile = 1 << 20

// sandboxNoteFile is the note's path in the guest's root.
const sandboxNoteFile = "/etc/vibedom/README"

// agentInstructions is each agent's user-level instructions file,
// relative to its home.
var agentInstructions = map[string]string{
	"claude":   ".claude/CLAUDE.md",
	"codex":    ".codex/AGENTS.md",
	"opencode": ".config/opencode/AGENTS.md",
	"gemini":   ".gemini/GEMINI.md",
}

// SandboxNote is the note for the session called name.
func SandboxNote(name string) string {
	return fmt.Sprintf(`# You are working inside a vibedom sandbox

- This is a Linux VM on the user's computer. /work is a copy of the user's project: your
  changes there come back to the user as a patch they review. Nothing else you change is kept.
- The network goes only through the host's allowlisting proxy. A name or port the user has
  not allowed is refused: DNS answers "no such host", and HTTP(S) through the proxy answers
  403 with an X-Vibedom-Refused header and a body naming the host and port.
- A refusal is the user's decision, not a fault of the network. Do not work around it (other
  hosts, IP addresses, DNS servers, mirrors, tunnels or proxies): that would be seen and
  refused too. Tell the user which host and port you need and why; they can allow it while
  you keep working with:  vibedom allow %s HOST
- Secrets are scrubbed from what you send; API keys in your environment are placeholders
  the host swaps for the real ones. This session is %s.
`, name, name)
}

// writeSandboxReadme puts the note in the guest's /etc/vibedom/README
// (root's, read-only to the agent), before anything runs in the guest.
func (s *sess) writeSandboxReadme(ctx context.Context) error {
	if s.client == nil {
		return nil
	}
	sc, err := s.client.SFTP()
	if err != nil {
		return fmt.Errorf("write the sandbox note: %w", err)
	}
	defer sc.Close()
	note := SandboxNote(s.name)
	root := "/"
	if s.rootImage != "" {
		root = proto.RootDir
	}
	readme := path.Join(root, sandboxNoteFile)
	if err := sc.MkdirAll(path.Dir(readme)); err != nil {
		return fmt.Errorf("write the sandbox note: %w", err)
	}
	w, err := sc.OpenFile(readme, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return fmt.Errorf("write the sandbox note: %w", err)
	}
	_, err = io.WriteString(w, note)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write the sandbox note: %w", err)
	}
	_ = sc.Chmod(readme, 0o644)
	return nil
}

// writeSandboxNotes appends the note to the agent's instructions file
// (created when the user has none), after the user's settings are copied.
func (s *sess) writeSandboxNotes(ctx context.Context) error {
	a := s.opts.Agent
	if a == nil || s.rootImage == "" {
		return nil
	}
	rel, ok := agentInstructions[a.Name]
	if !ok || s.client == nil {
		return nil
	}
	sc, err := s.client.SFTP()
	if err != nil {
		return fmt.Errorf("write the sandbox note: %w", err)
	}
	defer sc.Close()
	guestHome := path.Join(proto.RootDir, "home", proto.RootAgentUser)
	wrote, err := appendSandboxNote(sc, guestHome, rel, SandboxNote(s.name))
	if err != nil || !wrote {
		return err
	}
	s.log.Info("sandbox note written", "file", "~/"+rel)
	return nil
}

// appendSandboxNote appends note, after sandboxNoteMark, to the file rel
// under the guest home guestHome over sc, keeping what the file holds (the
// user's own instructions, copied in before). A file that already has the
// mark (a resumed or re-attached session) is left as it is: wrote is false.
func appendSandboxNote(sc *sftp.Client, guestHome, rel, note string) (wrote bool, err error) {
	dst := path.Join(guestHome, rel)
	var old []byte
	if f, err := sc.Open(dst); err == nil {
		old, _ = io.ReadAll(io.LimitReader(f, maxNoteFile))
		f.Close()
	}
	if bytes.Contains(old, []byte(sandboxNoteMark)) {
		return false, nil
	}
	var b bytes.Buffer
	b.Write(old)
	if len(old) > 0 {
		if !bytes.HasSuffix(old, []byte("\n")) {
			b.WriteByte('\n')
		}
		b.WriteByte('\n')
	}
	b.WriteString(sandboxNoteMark + "\n" + note)
	for d := path.Dir(dst); len(d) > len(guestHome); d = path.Dir(d) {
		if err := sc.MkdirAll(d); err != nil {
			return false, fmt.Errorf("write the sandbox note: %w", err)
		}
		defer func(d string) { _ = sc.Chown(d, 1000, 1000) }(d)
	}
	w, err := sc.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return false, fmt.Errorf("write the sandbox note: %w", err)
	}
	_, err = w.Write(b.Bytes())
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("write the sandbox note: %w", err)
	}
	_ = sc.Chown(dst, 1000, 1000)
	_ = sc.Chmod(dst, 0o600)
	return true, nil
}
