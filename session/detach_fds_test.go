//go:build unix

package session

import (
	"os"
	"os/exec"
	"strings"
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
