package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/childenv"
	"github.com/vibedom/vibedom/vm"
)

// The QEMU build's virtiofsd has no read-only option, and a guest's
// `mount -o ro` is no host guarantee. So vibedom starts each daemon through
// a small helper: the vibedom binary itself, re-executed with roHelperEnv
// set, in a new mount namespace (the kernel makes the copy private, so
// nothing reaches the host's mount table). There it binds the shared folder
// onto itself, remounts that bind and every mount below it read-only,
// checks the kernel says so, and only then executes virtiofsd. The daemon
// inherits that namespace: every write it attempts on the guest's behalf
// fails with EROFS in the host kernel, whatever root in the guest does.
const roHelperEnv = "VIBEDOM_VIRTIOFSD_RO_HELPER"

func init() {
	if os.Getenv(roHelperEnv) != "1" {
		return
	}
	// This process is the helper, not a vibedom command: it never returns
	// to main. On success it has become virtiofsd.
	err := roHelper(os.Args[1:])
	fmt.Fprintf(os.Stderr, "vibedom virtiofsd helper: %v\n", err)
	os.Exit(111)
}

// roHelper makes args[0] read-only in this mount namespace and executes
// args[1:].
func roHelper(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: SOURCE PROGRAM [ARG...]")
	}
	src := args[0]
	if err := makeReadOnly(src); err != nil {
		return err
	}
	env := make([]string, 0, len(os.Environ()))
	for _, e := range childenv.Environ() {
		if !strings.HasPrefix(e, roHelperEnv+"=") {
			env = append(env, e)
		}
	}
	return fmt.Errorf("execute %s: %w", args[1], unix.Exec(args[1], args[1:], env))
}

// makeReadOnly binds src onto itself and remounts it, and every mount
// below it, read-only. It must run in a private mount namespace.
func makeReadOnly(src string) error {
	if err := unix.Mount(src, src, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	points, err := mountsUnder(src)
	if err != nil {
		return err
	}
	for _, p := range points {
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
		err := unix.Mount("", p, "", flags, "")
		if errors.Is(err, unix.EPERM) {
			// A mount locked noexec keeps it.
			err = unix.Mount("", p, "", flags|unix.MS_NOEXEC, "")
		}
		if err != nil {
			return fmt.Errorf("remount %s read-only: %w", p, err)
		}
	}
	for _, p := range points {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			return fmt.Errorf("check %s: %w", p, err)
		}
		if st.Flags&unix.ST_RDONLY == 0 {
			return fmt.Errorf("%s is still writable after the read-only remount", p)
		}
	}
	return nil
}

// mountsUnder lists src and every mount point below it, parents first.
func mountsUnder(src string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	points := []string{src}
	seen := map[string]bool{src: true}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountinfo(fields[4])
		if strings.HasPrefix(p, src+"/") && !seen[p] {
			seen[p] = true
			points = append(points, p)
		}
	}
	return points, sc.Err()
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) the
// kernel writes in mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// virtiofsdPaths are where distributions install virtiofsd.
var virtiofsdPaths = []string{"/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd", "/usr/lib/virtiofsd"}

// findVirtiofsd returns the virtiofsd to use, or an error saying what to
// install.
func findVirtiofsd() (string, error) {
	if p := os.Getenv("VIBEDOM_VIRTIOFSD"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			return "", fmt.Errorf("VIBEDOM_VIRTIOFSD=%s: %v", p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("virtiofsd"); err == nil {
		return p, nil
	}
	for _, p := range virtiofsdPaths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("virtiofsd not found (Debian/Ubuntu: sudo apt-get install qemu-system-common, or set VIBEDOM_VIRTIOFSD)")
}

// virtiofsUsable reports why virtiofs cannot be used here, or nil.
func virtiofsUsable() error {
	if os.Geteuid() != 0 {
		return errors.New("virtiofsd and its read-only mount namespace need root; unprivileged QEMU shares over 9p")
	}
	if _, err := findVirtiofsd(); err != nil {
		return err
	}
	if _, err := os.Executable(); err != nil {
		return fmt.Errorf("find the vibedom binary to run the virtiofsd helper: %w", err)
	}
	return nil
}

// daemon is a virtiofsd serving one share.
type daemon struct {
	cmd    *exec.Cmd
	sock   string
	stderr *boundedBuffer
	exited chan struct{}
}

// startVirtiofsd starts a read-only virtiofsd for s on sock and waits for
// the socket to appear.
func startVirtiofsd(ctx context.Context, s vm.Share, sock string) (*daemon, error) {
	bin, err := findVirtiofsd()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", vm.ErrUnavailable, err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	src, err := filepath.EvalSymlinks(s.HostPath)
	if err != nil {
		return nil, fmt.Errorf("share %q: %w", s.Tag, err)
	}
	_ = os.Remove(sock)
	args := []string{src, bin, "--socket-path=" + sock, "-o", "source=" + src, "-o", "cache=auto", "-o", "no_posix_lock", "-o", "no_xattr"}
	if !s.ReadOnly {
		// vibedom shares nothing writable; refuse rather than run a
		// daemon without the guard.
		return nil, fmt.Errorf("%w: share %q is not read-only: virtiofs shares on QEMU are read-only only", vm.ErrInvalidConfig, s.Tag)
	}
	d := &daemon{sock: sock, stderr: &boundedBuffer{max: 8 << 10}, exited: make(chan struct{})}
	cmd := exec.Command(self, args...)
	cmd.Env = childenv.Environ(roHelperEnv + "=1") // no API key in virtiofsd's environment
	cmd.Stdout = d.stderr
	cmd.Stderr = d.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:      true,
		Pdeathsig:    syscall.SIGKILL,
		Unshareflags: syscall.CLONE_NEWNS, // Go also makes "/" private, recursively, before the exec
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start virtiofsd for share %q: %w", s.Tag, err)
	}
	d.cmd = cmd
	go func() { _ = cmd.Wait(); close(d.exited) }()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for i := 0; ; i++ {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return d, nil
		}
		select {
		case <-d.exited:
			return nil, fmt.Errorf("virtiofsd for share %q exited at start: %s", s.Tag, strings.TrimSpace(d.stderr.String()))
		case <-ctx.Done():
			d.stop()
			return nil, fmt.Errorf("start virtiofsd: %w", ctx.Err())
		case <-deadline.C:
			d.stop()
			return nil, fmt.Errorf("virtiofsd for share %q did not open its socket in 30 s: %s", s.Tag, strings.TrimSpace(d.stderr.String()))
		case <-time.After(min(vm.Backoff(i), 20*time.Millisecond)):
		}
	}
}

// stop ends the daemon (it also exits by itself when QEMU disconnects) and
// removes its socket.
func (d *daemon) stop() {
	select {
	case <-d.exited:
	default:
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
	}
	_ = os.Remove(d.sock)
}
