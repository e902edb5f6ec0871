package guest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

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
	t.Parallel()
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
	if err := unix.Mkfifo(filepath.Join(lower, "fifo"), 0o644); err != nil {
		t.Fatal(err)
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
	// A FIFO's reader and writer each wait for the other; the recorder
	// must not wait for either (its own descriptor is non-blocking).
	fifo := exec.Command("sh", "-c", `echo through > fifo & cat fifo; wait`)
	fifo.Dir = merged
	fifoDone := make(chan []byte, 1)
	go func() { b, _ := fifo.CombinedOutput(); fifoDone <- b }()
	select {
	case b := <-fifoDone:
		if string(b) != "through\n" {
			t.Errorf("through the FIFO: %q", b)
		}
	case <-time.After(time.Minute):
		fifo.Process.Kill()
		t.Fatalf("opening a FIFO in the overlay hangs")
	}
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

// BenchmarkOpenRecorded measures what recording bases costs an open in the
// overlay: each iteration opens and reads 1,000 small lower files (a second
// pass: versions already recorded) and 1,000 files already copied up.
func BenchmarkOpenRecorded(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for _, rec := range []bool{false, true} {
		b.Run(map[bool]string{false: "without", true: "with"}[rec], func(b *testing.B) {
			dir := b.TempDir()
			lower, upper, work, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
			for _, d := range []string{lower, upper, work, merged} {
				os.Mkdir(d, 0o755)
			}
			for i := range 2000 {
				os.WriteFile(filepath.Join(lower, fmt.Sprintf("f%d", i)), []byte("some content\n"), 0o644)
			}
			if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work+",redirect_dir=off,metacopy=off,index=off"); err != nil {
				b.Skipf("overlay: %v", err)
			}
			defer unix.Unmount(merged, unix.MNT_DETACH)
			for i := 1000; i < 2000; i++ {
				os.WriteFile(filepath.Join(merged, fmt.Sprintf("f%d", i)), []byte("copied up\n"), 0o644)
			}
			if rec {
				stop, err := recordBases(slog.New(slog.DiscardHandler), merged, upper, filepath.Join(dir, "bases.jsonl"))
				if err != nil {
					b.Skip(err)
				}
				defer stop()
			}
			for b.Loop() {
				for i := range 2000 {
					if _, err := os.ReadFile(filepath.Join(merged, fmt.Sprintf("f%d", i))); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
