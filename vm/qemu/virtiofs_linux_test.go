package qemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReadOnlyHelper runs the virtiofsd helper with a shell in place of
// virtiofsd: every write the "daemon" tries under the shared folder fails,
// reads work, and the host's own mount table is left as it was. (The shell
// keeps every capability, so it could remount; virtiofsd drops
// CAP_SYS_ADMIN after its set-up, and a guest's remount reaches it only as
// FUSE requests: the VM conformance suite tries that one.)
func TestReadOnlyHelper(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the helper needs root for its mount namespace")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "hello.txt"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	script := `cat "$1/hello.txt" || exit 2
for w in "echo x > \"$1/new.txt\"" "echo x >> \"$1/hello.txt\"" "rm \"$1/hello.txt\"" "mkdir \"$1/d\"" "chmod 777 \"$1\""; do
	if sh -c "$w" 2>/dev/null; then echo "WROTE: $w"; fi
done
grep -q " $1 .* ro[, ]" /proc/self/mountinfo && echo RO-MOUNT`
	cmd := exec.Command(self, src, "/bin/sh", "-c", script, "sh", src)
	cmd.Env = append(os.Environ(), roHelperEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "hi\n") {
		t.Errorf("reading through the helper: %q", out)
	}
	if strings.Contains(string(out), "WROTE") {
		t.Errorf("a write succeeded under the read-only guard:\n%s", out)
	}
	if !strings.Contains(string(out), "RO-MOUNT") {
		t.Errorf("the shared folder is not a read-only mount in the helper's namespace:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "hello.txt")); string(b) != "hi\n" {
		t.Errorf("hello.txt changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(src, "new.txt")); err == nil {
		t.Error("new.txt was created")
	}
	after, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) {
		t.Errorf("the host's mount table changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The host side of the folder is still writable.
	if err := os.WriteFile(filepath.Join(src, "host.txt"), nil, 0o644); err != nil {
		t.Errorf("the host can no longer write its own folder: %v", err)
	}
}

func TestReadOnlyHelperRefusesBadUse(t *testing.T) {
	if err := roHelper([]string{"/only-a-source"}); err == nil {
		t.Error("roHelper with no program: got nil error")
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:           "/a/b",
		`/with\040space`: "/with space",
		`/tab\011x\134y`: "/tab\tx\\y",
		`/bad\09`:        `/bad\09`,
		`/end\04`:        `/end\04`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}
