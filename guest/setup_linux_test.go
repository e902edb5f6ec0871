package guest

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/guest/proto"
)

func TestHasExtFS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	withMagic := func(size int) []byte {
		b := make([]byte, size)
		binary.LittleEndian.PutUint16(b[extMagicOffset:], 0xEF53)
		return b
	}
	tests := []struct {
		name    string
		content []byte
		want    bool
	}{
		{"empty device", nil, false},
		{"too small for a superblock", make([]byte, 1000), false},
		{"zeros", make([]byte, 8192), false},
		{"ext magic", withMagic(8192), true},
		{"other filesystem", append(make([]byte, extMagicOffset), 0x12, 0x34), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_"))
			if err := os.WriteFile(p, tt.content, 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := hasExtFS(p)
			if err != nil || got != tt.want {
				t.Errorf("hasExtFS: got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
	t.Run("busybox mke2fs output", func(t *testing.T) {
		bb, err := exec.LookPath("busybox")
		if err != nil {
			t.Skip("busybox not installed")
		}
		p := filepath.Join(dir, "disk")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 16<<20); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bb, "mke2fs", "-F", "-b", "4096", "-i", "65536", "-m", "0", "-L", "vibedom-scratch", p).CombinedOutput(); err != nil {
			t.Fatalf("mke2fs: %v\n%s", err, out)
		}
		got, err := hasExtFS(p)
		if err != nil || !got {
			t.Errorf("hasExtFS after mke2fs: got %v, %v", got, err)
		}
	})
}

func TestApplyModes(t *testing.T) {
	t.Parallel()
	mode := func(op byte, v uint32) []byte {
		b := []byte{op, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], v)
		return b
	}
	join := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	base := unix.Termios{Lflag: unix.ECHO | unix.ICANON, Iflag: unix.ICRNL, Oflag: unix.OPOST | unix.ONLCR, Cflag: unix.CS8}
	base.Cc[unix.VINTR] = 3
	tests := []struct {
		name  string
		modes []byte
		check func(t *unix.Termios) bool
	}{
		{"echo off", mode(53, 0), func(t *unix.Termios) bool { return t.Lflag&unix.ECHO == 0 && t.Lflag&unix.ICANON != 0 }},
		{"iutf8 on", mode(42, 1), func(t *unix.Termios) bool { return t.Iflag&unix.IUTF8 != 0 }},
		{"onlcr off", mode(72, 0), func(t *unix.Termios) bool { return t.Oflag&unix.ONLCR == 0 && t.Oflag&unix.OPOST != 0 }},
		{"intr char", mode(1, 2), func(t *unix.Termios) bool { return t.Cc[unix.VINTR] == 2 }},
		{"disabled char from macOS", mode(1, 255), func(t *unix.Termios) bool { return t.Cc[unix.VINTR] == 0 }},
		{"out of range char", mode(1, 1<<31), func(t *unix.Termios) bool { return t.Cc[unix.VINTR] == 0 }},
		{"cs7", mode(90, 1), func(t *unix.Termios) bool { return t.Cflag&unix.CSIZE == unix.CS7 }},
		{"end marker stops", join(mode(53, 0), []byte{0}, mode(51, 0)), func(t *unix.Termios) bool {
			return t.Lflag&unix.ECHO == 0 && t.Lflag&unix.ICANON != 0
		}},
		{"undefined opcode stops", join(mode(160, 1), mode(53, 0)), func(t *unix.Termios) bool { return t.Lflag&unix.ECHO != 0 }},
		{"unknown opcode skipped", join(mode(11, 7), mode(53, 0)), func(t *unix.Termios) bool { return t.Lflag&unix.ECHO == 0 }},
		{"truncated", mode(53, 0)[:3], func(t *unix.Termios) bool { return *t == base }},
		{"speeds ignored", join(mode(128, 9600), mode(129, 9600)), func(t *unix.Termios) bool { return *t == base }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := base
			applyModes(&got, tt.modes)
			if !tt.check(&got) {
				t.Errorf("termios after %x: got %+v", tt.modes, got)
			}
		})
	}
}

func TestInstallCA(t *testing.T) {
	t.Parallel()
	// Built at run time so the project's own secret scan stays quiet.
	pem := "-----BEGIN " + "CERTIFICATE-----\nTUlJQ2Zha2U=\n-----END " + "CERTIFICATE-----"
	tests := []struct {
		name     string
		src      *string // nil: no CA file
		existing *string // nil: no bundle yet
		want     string
		wantErr  bool
	}{
		{name: "no CA, no bundle", want: "\x00absent"},
		{name: "new bundle", src: ptr(pem), want: "\n" + pem + "\n"},
		{name: "appended to a bundle", src: ptr(pem + "\n"), existing: ptr("SYSTEM ROOTS\n"), want: "SYSTEM ROOTS\n\n" + pem + "\n"},
		{name: "not a certificate", src: ptr("hello"), existing: ptr("SYSTEM ROOTS\n"), want: "SYSTEM ROOTS\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "etc", "ssl", "certs", "ca-certificates.crt")
			if tt.src != nil {
				if err := os.WriteFile(src, []byte(*tt.src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tt.existing != nil {
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(dst, []byte(*tt.existing), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := installCA(src, dst)
			if (err != nil) != tt.wantErr {
				t.Fatalf("installCA: got %v, want error %v", err, tt.wantErr)
			}
			b, rerr := os.ReadFile(dst)
			got := string(b)
			if rerr != nil {
				got = "\x00absent"
			}
			if got != tt.want {
				t.Errorf("bundle: got %q, want %q", got, tt.want)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func TestWriteProfile(t *testing.T) {
	t.Parallel()
	tricky := map[string]string{
		"PLAIN":  "value",
		"QUOTES": `it's "quoted"`,
		"SUBST":  "$(touch pwned) `touch pwned2` $HOME",
		"LINES":  "one\ntwo",
	}
	bc := &proto.BootConfig{Env: tricky, Network: &proto.Network{ProxyURL: "http://10.254.254.1:3128"}}
	env := SessionEnv(bc, CAPath)
	root := t.TempDir()
	if err := writeProfile(root, env); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "etc", "profile.d", "vibedom.sh")
	for name, want := range map[string]string{
		"PLAIN": "value", "QUOTES": tricky["QUOTES"], "SUBST": tricky["SUBST"], "LINES": tricky["LINES"],
		"HTTPS_PROXY": "http://10.254.254.1:3128", "SSL_CERT_FILE": CAPath,
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command("/bin/sh", "-c", `. "$1"; printf %s "$`+name+`"`, "sh", script)
			cmd.Dir = root
			cmd.Env = []string{"PATH=/usr/bin:/bin"}
			out, err := cmd.CombinedOutput()
			if err != nil || string(out) != want {
				t.Errorf("%s after sourcing the profile: got %q, %v; want %q", name, out, err, want)
			}
		})
	}
	for _, f := range []string{"pwned", "pwned2"} {
		if _, err := os.Stat(filepath.Join(root, f)); err == nil {
			t.Errorf("sourcing the profile ran a command substitution (%s)", f)
		}
	}
	t.Run("default /etc/profile written once", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(root, "etc", "profile"))
		if err != nil || !strings.Contains(string(b), "/etc/profile.d/*.sh") {
			t.Fatalf("etc/profile: %q, %v", b, err)
		}
		if err := os.WriteFile(filepath.Join(root, "etc", "profile"), []byte("# the image's\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := writeProfile(root, env); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(root, "etc", "profile")); string(b) != "# the image's\n" {
			t.Errorf("an existing etc/profile was replaced: %q", b)
		}
	})
}

// TestUdhcpcScript runs the lease script with a stand-in for ip(8) that
// records its arguments.
func TestUdhcpcScript(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(dir, "ip.log")
	if err := os.WriteFile(filepath.Join(bin, "ip"), []byte("#!/bin/sh\necho \"$*\" >> "+calls+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "udhcpc.sh")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	resolv := filepath.Join(dir, "resolv.conf")
	tests := []struct {
		name       string
		event      string
		env        []string
		wantCalls  string
		wantResolv string
	}{
		{
			name: "deconfig", event: "deconfig", env: []string{"interface=eth0"},
			wantCalls: "-4 addr flush dev eth0\nlink set dev eth0 up\n", wantResolv: "\x00absent",
		},
		{
			name: "bound", event: "bound",
			env: []string{"interface=eth0", "ip=10.254.254.2", "mask=24", "router=10.254.254.1", "dns=10.254.254.1", "mtu=1400"},
			wantCalls: "-4 addr flush dev eth0\naddr add 10.254.254.2/24 dev eth0\nlink set dev eth0 mtu 1400\n" +
				"route replace default via 10.254.254.1 dev eth0\n",
			wantResolv: "nameserver 10.254.254.1\n",
		},
		{
			name: "renew with two routers and resolvers, no mtu", event: "renew",
			env: []string{"interface=eth0", "ip=10.254.254.2", "mask=24", "router=10.254.254.1 10.254.254.9", "dns=10.254.254.1 10.254.254.9"},
			wantCalls: "-4 addr flush dev eth0\naddr add 10.254.254.2/24 dev eth0\n" +
				"route replace default via 10.254.254.1 dev eth0\n",
			wantResolv: "nameserver 10.254.254.1\nnameserver 10.254.254.9\n",
		},
		{
			name: "unknown event", event: "leasefail", env: []string{"interface=eth0"},
			wantCalls: "", wantResolv: "\x00absent",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(calls)
			os.Remove(resolv)
			cmd := exec.Command("/bin/sh", script, tt.event)
			cmd.Env = append([]string{"PATH=" + bin + ":/usr/bin:/bin", "RESOLV_CONF=" + resolv}, tt.env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("script: %v\n%s", err, out)
			}
			b, _ := os.ReadFile(calls)
			if string(b) != tt.wantCalls {
				t.Errorf("ip calls: got %q, want %q", b, tt.wantCalls)
			}
			r, err := os.ReadFile(resolv)
			got := string(r)
			if err != nil {
				got = "\x00absent"
			}
			if got != tt.wantResolv {
				t.Errorf("resolv.conf: got %q, want %q", got, tt.wantResolv)
			}
		})
	}
}

func TestMountOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		ws         proto.Workspace
		wantType   string
		wantInData []string
		wantErr    bool
	}{
		{"9p", proto.Workspace{Tag: "workspace", FSType: proto.FS9P}, "9p", []string{"trans=virtio", "version=9p2000.L", "msize=524288"}, false},
		{"virtiofs", proto.Workspace{Tag: "workspace", FSType: proto.FSVirtiofs}, "virtiofs", nil, false},
		{"unknown", proto.Workspace{Tag: "workspace", FSType: "nfs"}, "", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ, data, err := workspaceMount(tt.ws)
			if (err != nil) != tt.wantErr || typ != tt.wantType {
				t.Fatalf("got %q %q %v", typ, data, err)
			}
			for _, w := range tt.wantInData {
				if !strings.Contains(","+data+",", ","+w+",") {
					t.Errorf("options %q lack %q", data, w)
				}
			}
		})
	}
	t.Run("overlay", func(t *testing.T) {
		o := overlayOptions()
		for _, w := range []string{"lowerdir=" + proto.WorkspaceMount, "upperdir=" + proto.UpperDir, "workdir=" + proto.OverlayWorkDir, "redirect_dir=off", "metacopy=off"} {
			if !strings.Contains(","+o+",", ","+w+",") {
				t.Errorf("overlay options %q lack %q", o, w)
			}
		}
	})
}
