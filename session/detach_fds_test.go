//go:build unix

package session

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestHostPipesNotInherited: the session host's readiness and secrets
// pipes (fds 3 and 4, inherited from run --detach) do not reach the
// programs the host starts (QEMU, virtiofsd, mitmdump, git): one of them
// holding the readiness pipe would keep `run --detach` waiting after the
// host died, or write lines to the user's terminal, and the secrets
// pipe is the host's alone.
func TestHostPipesNotInherited(t *testing.T) {
	if os.Getenv("VIBEDOM_TEST_HOST_PIPES") == "1" {
		ready, secrets := hostPipes()
		defer ready.Close()
		defer secrets.Close()
		out, err := exec.Command("/bin/sh", "-c", "for f in 3 4; do [ -e /dev/fd/$f ] && echo fd$f; done; true").Output()
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.Write(out)
		return
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	sr, sw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Close()
	defer sw.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostPipesNotInherited$", "-test.v")
	cmd.Env = append(os.Environ(), "VIBEDOM_TEST_HOST_PIPES=1")
	cmd.ExtraFiles = []*os.File{pw, sr}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("host: %v\n%s", err, out)
	}
	for _, fd := range []string{"fd3", "fd4"} {
		if strings.Contains(string(out), fd+"\n") {
			t.Errorf("a program the host starts inherits its %s:\n%s", fd, out)
		}
	}
}

// TestHostFileOwner: the host reads its options only from a private
// session folder of its user's, in a private file of its user's: a user
// who can write to the sessions folder (a home under a shared folder)
// cannot swap in a folder or file of their own, nor a FIFO that would
// hang the host.
func TestHostFileOwner(t *testing.T) {
	good := []byte(`{"version":1,"name":"app-1","workspace":"/w","cpus":2,"memory_mib":2048,"arch":"amd64",` +
		`"egress":{"proxy_engine":"go"},"dlp":{},"review":{},"preflight":"off"}`)
	other := os.Getuid() + 4242
	tests := []struct {
		name  string
		edit  func(t *testing.T, dir, file string)
		want  string
		owner bool // needs root to give a file away
	}{
		{"folder of another user", func(t *testing.T, dir, _ string) { chown(t, dir, other) }, "not a private folder of yours", true},
		{"folder open to others", func(t *testing.T, dir, _ string) { os.Chmod(dir, 0o755) }, "not a private folder of yours", false},
		{"file of another user", func(t *testing.T, _, f string) { chown(t, f, other) }, "not a private file of yours", true},
		{"file readable by others", func(t *testing.T, _, f string) { os.Chmod(f, 0o644) }, "not a private file of yours", false},
		{"fifo", func(t *testing.T, _, f string) {
			os.Remove(f)
			if err := syscall.Mkfifo(f, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "regular file", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.owner && os.Getuid() != 0 {
				t.Skip("giving a file to another user needs root")
			}
			_, dir := hostDir(t, "app-1")
			f := filepath.Join(dir, hostFileName)
			if err := os.WriteFile(f, good, 0o600); err != nil {
				t.Fatal(err)
			}
			tt.edit(t, dir, f)
			_, err := readHostFile(dir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one about %q", err, tt.want)
			}
		})
	}
}

func chown(t *testing.T, p string, uid int) {
	t.Helper()
	if err := os.Lchown(p, uid, -1); err != nil {
		t.Fatal(err)
	}
}
