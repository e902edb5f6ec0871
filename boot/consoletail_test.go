package boot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConsoleTailEscapes: the guest's console, shown when a boot fails, is
// guest output; its control and invisible characters are shown escaped,
// not sent to the terminal and not silently dropped.
func TestConsoleTailEscapes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(p, []byte("ok line\nevil\x1b[2J\x1b]0;title\x07\u009b31m\x9b\u202e\u2028\U000e0041 end\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := ConsoleTail(p, 5)
	want := "  ok line\n  evil\\x1b[2J\\x1b]0;title\\x07\\u009b31m\\x9b\\u202e\\u2028\\U000e0041 end"
	if got != want {
		t.Errorf("ConsoleTail:\n got %q\nwant %q", got, want)
	}
	if strings.ContainsAny(got, "\x1b\x07\u009b\u202e\u2028") {
		t.Errorf("raw control characters: %q", got)
	}
}
