package overlay

import (
	"errors"
	"testing"
)

// TestCheckNotHome: `vibedom run ~` (or a folder above home) is refused;
// a project folder inside it is not (issue 18 item 6, dotfiles).
func TestCheckNotHome(t *testing.T) {
	t.Parallel()
	for ws, refused := range map[string]bool{
		"/home/u": true, "/home/u/": true, "/home": true, "/": true,
		"/home/u/projects/app": false, "/home/uu": false, "/srv/app": false,
	} {
		err := CheckNotHome(ws, "/home/u")
		if got := errors.Is(err, ErrHomeWorkspace); got != refused {
			t.Errorf("CheckNotHome(%s): %v, want refused %v", ws, err, refused)
		}
	}
}
