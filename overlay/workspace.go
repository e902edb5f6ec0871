package overlay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrHomeWorkspace means a workspace is the user's home folder or holds it.
var ErrHomeWorkspace = errors.New("the workspace holds your home folder")

// CheckNotHome refuses a workspace (absolute, symlink-free) that is the
// user's home folder or a folder above it. Everything in a home folder runs
// code on the host sooner or later (shell startup files, ~/.ssh, ~/.config,
// ~/.local/bin, LaunchAgents, every tool's settings): no table of names
// can cover it, and vibedom's own keys live there too. home is $HOME when
// "".
func CheckNotHome(ws, home string) error {
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	if home == "" {
		return nil
	}
	if h, err := filepath.EvalSymlinks(home); err == nil {
		home = h
	}
	ws, home = filepath.Clean(ws), filepath.Clean(home)
	if ws == home || ws == "/" || strings.HasPrefix(home, strings.TrimSuffix(ws, "/")+"/") {
		return fmt.Errorf("%w (%s): your shell's startup files, ~/.ssh and every tool's settings there run code on the host; give a project folder instead", ErrHomeWorkspace, home)
	}
	return nil
}
