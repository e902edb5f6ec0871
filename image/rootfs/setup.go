package rootfs

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/ext4"
)

// busyboxPaths is where Alpine's busybox package lists its applets.
const busyboxPaths = "etc/busybox-paths.d/busybox"

// setup does on the host what install scripts and triggers would have done
// in a booted system and what vibedom's guest needs. Each step is recorded
// in t.done.
func (t *tree) setup(l *alpine.Lock, exclude []string) error {
	has := func(name string) bool {
		return !slices.Contains(exclude, name) && slices.ContainsFunc(l.Packages, func(p alpine.LockedPackage) bool { return p.Name == name })
	}
	meta := func(mode fs.FileMode) ext4.Meta { return ext4.Meta{Mode: mode, ModTime: t.newest} }

	// Standard directories with their modes (a package may have made them
	// with others, or not at all).
	for _, d := range []struct {
		p    string
		mode fs.FileMode
	}{{"tmp", 0o777 | fs.ModeSticky}, {"var/tmp", 0o777 | fs.ModeSticky}, {"root", 0o700}, {"proc", 0o555}, {"sys", 0o555},
		{"dev", 0o755}, {"run", 0o755}, {"work", 0o755}, {"home", 0o755}, {"etc", 0o755}} {
		n, err := t.resolveDir(d.p, true, meta(d.mode))
		if err != nil {
			return fmt.Errorf("rootfs: /%s: %w", d.p, err)
		}
		n.Meta.Mode, n.Meta.UID, n.Meta.GID = d.mode, 0, 0
	}
	t.note("made /tmp and /var/tmp 1777, /root 0700, and the mount points /proc /sys /dev /run /work")

	if has("busybox") {
		n, err := t.applets()
		if err != nil {
			return err
		}
		t.note(fmt.Sprintf("linked %d busybox applets (from /%s; programs other packages install are kept)", n, busyboxPaths))
	}
	if err := t.users(); err != nil {
		return err
	}
	if has("doas") {
		if err := t.putFile("etc/doas.d/vibedom.conf", 0o400, "permit nopass "+AgentUser+" as root\n"); err != nil {
			return err
		}
		t.note("let " + AgentUser + " run commands as root without a password (/etc/doas.d/vibedom.conf)")
	}
	if has("sudo") {
		if err := t.putFile("etc/sudoers.d/vibedom", 0o440, AgentUser+" ALL=(ALL) NOPASSWD: ALL\n"); err != nil {
			return err
		}
		t.note("let " + AgentUser + " use sudo without a password (/etc/sudoers.d/vibedom)")
	}
	if err := t.devNodes(); err != nil {
		return err
	}
	if n := t.lookup("etc/ssl/certs/ca-certificates.crt"); n == nil || n.Type != ext4.TypeFile || n.Size == 0 {
		return fmt.Errorf("rootfs: no CA bundle at /etc/ssl/certs/ca-certificates.crt: add ca-certificates-bundle to the package list")
	}
	t.note("checked the CA bundle /etc/ssl/certs/ca-certificates.crt (the session's CA is added at boot, never here)")
	etc, _ := t.resolveDir("etc", false, ext4.Meta{})
	if child(etc, "mtab") == nil {
		setChild(etc, "mtab", &ext4.Node{Type: ext4.TypeSymlink, Target: "/proc/mounts", Meta: meta(0o777)})
	}
	if child(etc, "hostname") == nil {
		if err := t.putFile("etc/hostname", 0o644, "vibedom\n"); err != nil {
			return err
		}
	}
	t.note("linked /etc/mtab to /proc/mounts; set /etc/hostname")
	var db strings.Builder
	for _, r := range t.installed {
		db.WriteString(r)
	}
	if err := t.putFile("lib/apk/db/installed", 0o644, db.String()); err != nil {
		return err
	}
	t.note("wrote apk's database (/lib/apk/db/installed) so apk in the guest knows what is installed")
	return nil
}

func (t *tree) note(s string) { t.done = append(t.done, s) }

// putFile writes a small root-owned file, replacing what is there.
func (t *tree) putFile(p string, mode fs.FileMode, content string) error {
	dir, name := path.Split(p)
	d, err := t.resolveDir(dir, true, ext4.Meta{Mode: 0o755, ModTime: t.newest})
	if err != nil {
		return fmt.Errorf("rootfs: /%s: %w", p, err)
	}
	if old := child(d, name); old != nil && old.Type != ext4.TypeFile && old.Type != ext4.TypeSymlink {
		return fmt.Errorf("rootfs: /%s exists and is not a file", p)
	}
	n, err := t.addFile(ext4.Meta{Mode: mode, ModTime: t.newest}, int64(len(content)), strings.NewReader(content))
	if err != nil {
		return err
	}
	setChild(d, name, n)
	return nil
}

// applets links busybox's applets where nothing else is installed.
func (t *tree) applets() (int, error) {
	list, err := t.content(t.lookup(busyboxPaths), 1<<20)
	if err != nil {
		return 0, fmt.Errorf("rootfs: the busybox package has no /%s (%v): it lists where busybox's applets go, and vibedom links them from it", busyboxPaths, err)
	}
	if t.lookup("bin/busybox") == nil {
		return 0, fmt.Errorf("rootfs: busybox is in the package list but /bin/busybox is missing")
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(list))
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" || strings.HasPrefix(p, "#") {
			continue
		}
		c := path.Clean(p)
		if c == "/bin/busybox" {
			continue
		}
		if !strings.HasPrefix(c, "/") || c != p || strings.Contains(c, "\x00") || strings.Count(c, "/") > 4 {
			return 0, fmt.Errorf("rootfs: /%s: %q is not an applet path", busyboxPaths, p)
		}
		dir, name := path.Split(strings.TrimPrefix(c, "/"))
		d, err := t.resolveDir(dir, true, ext4.Meta{Mode: 0o755, ModTime: t.newest})
		if err != nil {
			return 0, fmt.Errorf("rootfs: applet %s: %w", c, err)
		}
		if child(d, name) != nil {
			continue // a real program (coreutils, bash…) wins
		}
		setChild(d, name, &ext4.Node{Type: ext4.TypeSymlink, Target: "/bin/busybox", Meta: ext4.Meta{Mode: 0o777, ModTime: t.newest}})
		n++
	}
	return n, sc.Err()
}

// account is one line of /etc/passwd or /etc/group.
type account struct {
	fields []string
}

func parseDB(b []byte, nfields int) ([]account, error) {
	var out []account
	for i, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) != nfields {
			return nil, fmt.Errorf("line %d has %d fields, not %d", i+1, len(f), nfields)
		}
		out = append(out, account{f})
	}
	return out, nil
}

func formatDB(a []account) string {
	var b strings.Builder
	for _, x := range a {
		b.WriteString(strings.Join(x.fields, ":"))
		b.WriteByte('\n')
	}
	return b.String()
}

// users merges root and the agent user into /etc/passwd, /etc/group and
// /etc/shadow, keeping what packages put there, and makes the agent's home.
func (t *tree) users() error {
	read := func(p string) ([]byte, error) {
		n := t.lookup(p)
		if n == nil {
			return nil, nil
		}
		return t.content(n, 1<<20)
	}
	pw, err := read("etc/passwd")
	if err != nil {
		return fmt.Errorf("rootfs: /etc/passwd: %w", err)
	}
	users, err := parseDB(pw, 7)
	if err != nil {
		return fmt.Errorf("rootfs: /etc/passwd: %w", err)
	}
	gr, err := read("etc/group")
	if err != nil {
		return fmt.Errorf("rootfs: /etc/group: %w", err)
	}
	groups, err := parseDB(gr, 4)
	if err != nil {
		return fmt.Errorf("rootfs: /etc/group: %w", err)
	}
	shell := "/bin/sh"
	if t.lookup("bin/bash") != nil {
		shell = "/bin/bash"
	}
	uid := strconv.Itoa(AgentUID)
	find := func(a []account, name string) int {
		return slices.IndexFunc(a, func(x account) bool { return x.fields[0] == name })
	}
	byID := func(a []account, idField int, id string) int {
		return slices.IndexFunc(a, func(x account) bool { return x.fields[idField] == id })
	}
	if find(users, "root") < 0 {
		users = append([]account{{[]string{"root", "x", "0", "0", "root", "/root", "/bin/sh"}}}, users...)
	}
	if i := find(users, AgentUser); i >= 0 {
		if users[i].fields[2] != uid {
			return fmt.Errorf("rootfs: a package made user %s with uid %s; vibedom needs it to be %s", AgentUser, users[i].fields[2], uid)
		}
	} else {
		if i := byID(users, 2, uid); i >= 0 {
			return fmt.Errorf("rootfs: uid %s is taken by %s in /etc/passwd; vibedom's %s user needs it", uid, users[i].fields[0], AgentUser)
		}
		users = append(users, account{[]string{AgentUser, "x", uid, uid, "vibedom agent", AgentHome, shell}})
	}
	if find(groups, "root") < 0 {
		groups = append([]account{{[]string{"root", "x", "0", "root"}}}, groups...)
	}
	if i := find(groups, AgentUser); i < 0 {
		if j := byID(groups, 2, uid); j >= 0 {
			return fmt.Errorf("rootfs: gid %s is taken by group %s; vibedom's %s group needs it", uid, groups[j].fields[0], AgentUser)
		}
		groups = append(groups, account{[]string{AgentUser, "x", uid, ""}})
	}
	// The agent is in wheel when there is one (doas and sudo configs
	// often name it).
	if i := find(groups, "wheel"); i >= 0 {
		members := strings.Split(groups[i].fields[3], ",")
		if !slices.Contains(members, AgentUser) {
			if groups[i].fields[3] == "" {
				groups[i].fields[3] = AgentUser
			} else {
				groups[i].fields[3] += "," + AgentUser
			}
		}
	}
	if err := t.putFile("etc/passwd", 0o644, formatDB(users)); err != nil {
		return err
	}
	if err := t.putFile("etc/group", 0o644, formatDB(groups)); err != nil {
		return err
	}
	// Shadow: every account locked (no password logs in; the agent gets
	// root through doas/sudo configured above, or --root).
	var sh strings.Builder
	for _, u := range users {
		fmt.Fprintf(&sh, "%s:!::0:::::\n", u.fields[0])
	}
	if err := t.putFile("etc/shadow", 0o640, sh.String()); err != nil {
		return err
	}
	home, err := t.resolveDir(strings.TrimPrefix(AgentHome, "/"), true, ext4.Meta{Mode: 0o755, ModTime: t.newest})
	if err != nil {
		return fmt.Errorf("rootfs: %s: %w", AgentHome, err)
	}
	home.Meta = ext4.Meta{Mode: 0o755, UID: AgentUID, GID: AgentUID, ModTime: t.newest}
	t.note(fmt.Sprintf("added user %s (uid %d, home %s, shell %s) to /etc/passwd and /etc/group, kept the packages' accounts, locked every password in /etc/shadow", AgentUser, AgentUID, AgentHome, shell))
	return nil
}

// devNodes adds the basic device nodes (the guest mounts devtmpfs over
// /dev; these are the fallback).
func (t *tree) devNodes() error {
	dev, err := t.resolveDir("dev", true, ext4.Meta{Mode: 0o755, ModTime: t.newest})
	if err != nil {
		return err
	}
	for _, d := range []struct {
		name         string
		major, minor uint32
		mode         fs.FileMode
	}{{"console", 5, 1, 0o600}, {"null", 1, 3, 0o666}, {"zero", 1, 5, 0o666}, {"full", 1, 7, 0o666},
		{"random", 1, 8, 0o666}, {"urandom", 1, 9, 0o666}, {"tty", 5, 0, 0o666}} {
		if child(dev, d.name) == nil {
			setChild(dev, d.name, &ext4.Node{Type: ext4.TypeCharDev, Major: d.major, Minor: d.minor, Meta: ext4.Meta{Mode: d.mode, ModTime: t.newest}})
		}
	}
	if child(dev, "ptmx") == nil {
		setChild(dev, "ptmx", &ext4.Node{Type: ext4.TypeSymlink, Target: "pts/ptmx", Meta: ext4.Meta{Mode: 0o777, ModTime: t.newest}})
	}
	for _, d := range []string{"pts", "shm"} {
		if child(dev, d) == nil {
			setChild(dev, d, &ext4.Node{Type: ext4.TypeDir, Meta: ext4.Meta{Mode: 0o755, ModTime: t.newest}})
		}
	}
	t.note("made /dev/console, null, zero, full, random, urandom, tty and ptmx (devtmpfs covers them at boot)")
	return nil
}
