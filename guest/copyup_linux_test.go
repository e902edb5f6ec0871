package guest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/overlay"
)

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestRecordBases mounts an OverlayFS as the guest does, records bases
// with fanotify, and plays the session: the user edits the lower (the live
// workspace) while the agent works in the merged dir, in place and by
// rename, or opens files without changing them. The change set then names
// the version each agent copy started from, and unchanged copy-ups are no
// change even though the lower moved on.
func TestRecordBases(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("OverlayFS and fanotify permission events need root")
	}
	dir := t.TempDir()
	lower, upper, work, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{lower, upper, work, merged} {
		os.Mkdir(d, 0o755)
	}
	start := map[string]string{
		"inplace.txt": "header\nx\nx\nx\n",
		"renamed.txt": "header\nx\nx\nx\n",
		"rdwr.txt":    "one\n",
		"touched.txt": "one\n",
		"read.txt":    "one\n",
	}
	for name, c := range start {
		if err := os.WriteFile(filepath.Join(lower, name), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work+",redirect_dir=off,metacopy=off,index=off"); err != nil {
		t.Skipf("cannot mount OverlayFS here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	out := filepath.Join(dir, "bases.jsonl")
	stop, err := recordBases(slog.New(slog.DiscardHandler), merged, upper, out)
	if err != nil {
		t.Skipf("fanotify permission events unavailable: %v", err)
	}
	defer stop()
	user := func(name, content string) { // the host edits the live workspace in place
		t.Helper()
		if err := os.WriteFile(filepath.Join(lower, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	agent := func(script string) {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		cmd.Dir = merged
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", script, err, out)
		}
	}
	userDeleted := "header\nx\nx\n"
	user("inplace.txt", userDeleted)
	user("renamed.txt", userDeleted)
	agent(`c=$(tail -n +2 inplace.txt); printf 'HEADER\n%s\n' "$c" > inplace.txt`)
	agent(`sed 1s/header/HEADER/ renamed.txt > .tmp && mv .tmp renamed.txt`)
	agent(`: <> rdwr.txt; touch touched.txt; cat read.txt >/dev/null`)
	for _, name := range []string{"rdwr.txt", "touched.txt", "read.txt"} {
		user(name, "one\nuser\n")
	}
	stop()

	bases, err := readBases(out)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := overlay.ScanChangesFrom(lower, upper, bases)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]overlay.Change{}
	for _, c := range cs.Changes {
		got[c.Path] = c
	}
	for _, name := range []string{"inplace.txt", "renamed.txt"} {
		c, ok := got[name]
		if !ok || c.Op != overlay.OpModify || c.SHA256 != sha("HEADER\nx\nx\n") {
			t.Errorf("%s: %+v, want a modify to the agent's content", name, c)
			continue
		}
		if c.BaseSHA256 != sha(userDeleted) || c.BaseMode != 0o644 {
			t.Errorf("%s: base %s %o, want the user's version %s 644", name, c.BaseSHA256, c.BaseMode, sha(userDeleted))
		}
	}
	for _, name := range []string{"rdwr.txt", "touched.txt", "read.txt"} {
		if c, ok := got[name]; ok {
			t.Errorf("%s: %+v in the change set; the agent did not change it", name, c)
		}
	}
	if _, err := os.Lstat(filepath.Join(upper, "touched.txt")); err != nil {
		t.Errorf("touched.txt was not copied up (the test does not test what it says): %v", err)
	}
	if _, err := overlay.ParseChangeSet(mustJSON(t, cs)); err != nil {
		t.Errorf("the host refuses the change set: %v", err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
