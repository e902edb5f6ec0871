package guest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/guest/proto"
)

// The root image (proto.Root): vibedom-guest stays PID 1 in the initramfs,
// which keeps the control plane (the SSH server, collect, changes) out of
// the agent's reach and independent of what the image holds. User commands
// run chrooted into proto.RootDir: an overlay whose lower layer is the
// read-only image and whose upper layer is on the session's scratch disk,
// with /proc, /sys, /dev, /work and a fresh /tmp and /run mounted inside. A
// chroot is no boundary against root inside the guest, and is not meant to
// be: the VM is the boundary, and nothing in the guest is trusted.

// findRootDevice returns the block device whose ext4 label is label. It
// reads each virtio disk's superblock, never trusting device order.
func findRootDevice(label string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		ents, _ := os.ReadDir("/sys/block")
		for _, e := range ents {
			name := e.Name()
			if !strings.HasPrefix(name, "vd") {
				continue
			}
			dev := "/dev/" + name
			if l, ok := extLabel(dev); ok && l == label {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no disk with the ext4 label %q: the root image is missing or damaged (run `vibedom init` on the host)", label)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// extLabel reads an ext2/3/4 volume label.
func extLabel(dev string) (string, bool) {
	f, err := os.Open(dev)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return "", false
	}
	if binary.LittleEndian.Uint16(sb[0x38:]) != 0xEF53 {
		return "", false
	}
	return string(bytes.TrimRight(sb[0x78:0x88], "\x00")), true
}

// mountRoot assembles the root image's overlay and what user commands need
// inside it.
func mountRoot(log *slog.Logger, r *proto.Root, layers []proto.Layer) error {
	dev, err := findRootDevice(r.Label, 5*time.Second)
	if err != nil {
		return err
	}
	for _, d := range []string{proto.RootLower, proto.RootDir, proto.RootUpperDir, proto.RootWorkDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(dev, proto.RootLower, "ext4", unix.MS_RDONLY|unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mount the root image %s: %w", dev, err)
	}
	opts := "lowerdir=" + proto.RootLower + ",upperdir=" + proto.RootUpperDir + ",workdir=" + proto.RootWorkDir
	if err := unix.Mount("overlay", proto.RootDir, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount the root overlay: %w", err)
	}
	in := func(p string) string { return filepath.Join(proto.RootDir, p) }
	binds := []struct{ src, dst string }{
		{"/proc", "/proc"}, {"/sys", "/sys"}, {"/dev", "/dev"}, {proto.WorkDir, proto.WorkDir},
	}
	for _, b := range binds {
		if err := os.MkdirAll(in(b.dst), 0o755); err != nil {
			return err
		}
		if err := unix.Mount(b.src, in(b.dst), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("mount %s in the root: %w", b.src, err)
		}
	}
	for _, t := range []struct {
		dst  string
		data string
	}{{"/tmp", "mode=1777"}, {"/run", "mode=0755"}} {
		if err := os.MkdirAll(in(t.dst), 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", in(t.dst), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, t.data); err != nil {
			return fmt.Errorf("mount %s in the root: %w", t.dst, err)
		}
	}
	for _, l := range layers {
		if err := mountLayer(l); err != nil {
			return err
		}
	}
	// Name resolution and the host name, as the initramfs has them.
	for _, f := range []string{"/etc/resolv.conf", "/etc/hosts", "/etc/hostname"} {
		if err := copyInto(f, in(f)); err != nil {
			log.Debug("not copied into the root", "file", f, "err", err)
		}
	}
	// The workspace belongs to the host user, not the agent: git's
	// ownership check would refuse every repository under /work. The VM
	// has one user, whom the check would protect from itself.
	if err := appendFile(in("/etc/gitconfig"), "[safe]\n\tdirectory = *\n"); err != nil {
		return fmt.Errorf("configure git in the root: %w", err)
	}
	// The session's CA joins the image's bundle (in the upper layer: the
	// image itself never holds it).
	if err := installCA(proto.CACertPath, in(CAPath)); err != nil {
		return fmt.Errorf("add the session CA to the root's bundle: %w", err)
	}
	return nil
}

// mountLayer mounts a read-only layer image inside the root.
func mountLayer(l proto.Layer) error {
	clean := filepath.Clean(l.Mount)
	if !filepath.IsAbs(clean) || clean == "/" || clean != l.Mount {
		return fmt.Errorf("layer %q: mount point %q must be a clean absolute path", l.Label, l.Mount)
	}
	dev, err := findRootDevice(l.Label, 5*time.Second)
	if err != nil {
		return err
	}
	dst := filepath.Join(proto.RootDir, clean)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, dst, "ext4", unix.MS_RDONLY|unix.MS_NOATIME|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("mount layer %s at %s: %w", l.Label, l.Mount, err)
	}
	return nil
}

// appendFile appends text to the file at p (made if missing).
func appendFile(p, text string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyInto copies a small file from the initramfs into the root, replacing
// what is there (a symlink included).
func copyInto(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	_ = os.Remove(dst)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// maxAccountFile bounds /etc/passwd and /etc/group read from the image.
const maxAccountFile = 1 << 20

// lookupUser reads name's account from root's /etc/passwd and /etc/group
// (the image is data here: fields are checked, not trusted).
func lookupUser(root, name string) (*ImageUser, error) {
	pw, err := atomicfile.ReadLimited(filepath.Join(root, "etc/passwd"), maxAccountFile)
	if err != nil {
		return nil, err
	}
	var u *ImageUser
	for _, line := range strings.Split(string(pw), "\n") {
		f := strings.Split(line, ":")
		if len(f) != 7 || f[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil || !strings.HasPrefix(f[5], "/") || !strings.HasPrefix(f[6], "/") {
			return nil, fmt.Errorf("the image's /etc/passwd entry for %s is malformed", name)
		}
		u = &ImageUser{Name: name, UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
		break
	}
	if u == nil {
		return nil, fmt.Errorf("the image has no user %s in /etc/passwd", name)
	}
	if gr, err := atomicfile.ReadLimited(filepath.Join(root, "etc/group"), maxAccountFile); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(gr))
		for sc.Scan() {
			f := strings.Split(sc.Text(), ":")
			if len(f) != 4 {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == name {
					if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil {
						u.Groups = append(u.Groups, uint32(gid))
					}
				}
			}
		}
	}
	return u, nil
}

// rootReady reports whether the root overlay is mounted.
func rootReady() bool {
	_, err := os.Stat(filepath.Join(proto.RootDir, "etc"))
	return err == nil
}

// agentCaps gives the agent's commands the file-access capabilities (see
// Server.start).
func agentCaps(a *syscall.SysProcAttr) {
	a.AmbientCaps = []uintptr{unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER}
}
