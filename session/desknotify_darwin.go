package session

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/vibedom/vibedom/childenv"
)

// osascript is macOS's AppleScript runner, by its absolute path (never
// looked up in PATH).
const osascript = "/usr/bin/osascript"

var deskPlatform deskPost = osascriptPost

// osascriptPost posts a notification through osascript, in the clean
// environment. The title starts with "vibedom", so osascript never reads
// it (or the text after it) as an option.
func osascriptPost(ctx context.Context, title, text string) error {
	cmd := exec.CommandContext(ctx, osascript, osascriptArgs(title, text)...)
	cmd.Env = childenv.Environ()
	cmd.WaitDelay = time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("osascript: %w: %.200s", err, out)
	}
	return nil
}
