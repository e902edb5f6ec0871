package image

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/image/initramfs"
)

// fakeHostKey returns a PEM block shaped like an OpenSSH private key,
// assembled at run time so secret scanners stay quiet on the repository.
func fakeHostKey() []byte {
	return []byte("-----BEGIN " + "OPENSSH PRIVATE" + " KEY-----\n" +
		"c2VjcmV0LWhvc3Qta2V5LW1hdGVyaWFsLWZvci10ZXN0cw==\n" +
		"-----END " + "OPENSSH PRIVATE" + " KEY-----\n")
}

func fakeCA() []byte {
	return []byte("-----BEGIN CERTIFICATE-----\nTUlJQ0FURVNU\n-----END CERTIFICATE-----\n")
}

func testBootConfig() *proto.BootConfig {
	return &proto.BootConfig{
		Version:        proto.Version,
		SessionID:      "s-1",
		Hostname:       "vibedom",
		Control:        proto.Control{Transport: proto.TransportVirtioSerial, Name: "vibedom.control"},
		Workspace:      proto.Workspace{Tag: "workspace", FSType: proto.FS9P},
		Scratch:        proto.Scratch{Device: "/dev/vda"},
		AuthorizedKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests host"},
	}
}

func TestSessionFiles(t *testing.T) {
	t.Parallel()
	bad := testBootConfig()
	bad.AuthorizedKeys = nil
	tests := []struct {
		name      string
		cfg       *proto.BootConfig
		key, ca   []byte
		wantPaths []string
		wantErr   bool
	}{
		{"with CA", testBootConfig(), fakeHostKey(), fakeCA(), []string{proto.BootConfigPath, proto.HostKeyPath, proto.CACertPath}, false},
		{"without CA", testBootConfig(), fakeHostKey(), nil, []string{proto.BootConfigPath, proto.HostKeyPath}, false},
		{"invalid config", bad, fakeHostKey(), nil, nil, true},
		{"no config", nil, fakeHostKey(), nil, nil, true},
		{"no host key", testBootConfig(), nil, nil, nil, true},
		{"host key not PEM", testBootConfig(), []byte("ssh-ed25519 AAAA"), nil, nil, true},
		{"CA not a certificate", testBootConfig(), fakeHostKey(), fakeHostKey(), nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files, err := SessionFiles(tt.cfg, tt.key, tt.ca)
			if tt.wantErr {
				if err == nil {
					t.Errorf("SessionFiles accepted it")
				}
				return
			}
			if err != nil {
				t.Fatalf("SessionFiles: %v", err)
			}
			var paths []string
			for _, f := range files {
				paths = append(paths, f.Path)
				wantMode := fs.FileMode(0o644)
				if f.Path == proto.HostKeyPath {
					wantMode = 0o600
				}
				if f.Mode != wantMode {
					t.Errorf("%s: mode %v, want %v", f.Path, f.Mode, wantMode)
				}
			}
			if !slices.Equal(paths, tt.wantPaths) {
				t.Errorf("paths: got %v, want %v", paths, tt.wantPaths)
			}
			cfg, err := proto.Parse(files[0].Data)
			if err != nil || cfg.SessionID != "s-1" {
				t.Errorf("boot config does not parse back: %v", err)
			}
		})
	}
}

// TestFileRedacts checks that the host key never reaches a log line or a
// formatted value.
func TestFileRedacts(t *testing.T) {
	t.Parallel()
	key := fakeHostKey()
	f := initramfs.File{Path: proto.HostKeyPath, Mode: 0o600, Data: key}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("session file", "file", f)
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("session files", "files", []initramfs.File{f})
	outputs := map[string]string{
		"String":   f.String(),
		"%v":       fmt.Sprintf("%v", f),
		"%+v":      fmt.Sprintf("%+v", f),
		"%#v":      fmt.Sprintf("%#v", f),
		"%s slice": fmt.Sprintf("%s", []initramfs.File{f}),
		"slog":     logged.String(),
	}
	for name, out := range outputs {
		t.Run(name, func(t *testing.T) {
			if strings.Contains(out, "c2VjcmV0") || strings.Contains(out, "PRIVATE") ||
				strings.Contains(out, base64.StdEncoding.EncodeToString(key)[:20]) {
				t.Errorf("secret shown: %s", out)
			}
			if !strings.Contains(out, proto.HostKeyPath) {
				t.Errorf("path not shown: %s", out)
			}
		})
	}
}

// fakeBase caches a small base image and returns it.
func fakeBase(t *testing.T) *Image {
	t.Helper()
	var ar initramfs.Archive
	ar.Dir("tmp", fs.ModeDir|fs.ModeSticky|0o777)
	ar.Dir("etc", 0o755)
	ar.File("etc/hostname", 0o644, []byte("base\n"))
	ar.Symlink("init", proto.GuestBinaryPath)
	ar.File(strings.TrimPrefix(proto.GuestBinaryPath, "/"), 0o755, bytes.Repeat([]byte("guest"), 10000))
	data, err := ar.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "initramfs.cpio")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return &Image{Name: "fake", Dir: dir, Initrd: p, InitrdSize: int64(len(data))}
}

func TestWriteSessionInitrd(t *testing.T) {
	t.Parallel()
	base := fakeBase(t)
	files, err := SessionFiles(testBootConfig(), fakeHostKey(), fakeCA())
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "initrd")
	if err := WriteSessionInitrd(dst, base, files); err != nil {
		t.Fatalf("WriteSessionInitrd: %v", err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("initrd mode: got %v, want 0600 (it holds the host key)", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(dst)
	baseData, _ := os.ReadFile(base.Initrd)
	if !bytes.HasPrefix(data, baseData) {
		t.Fatalf("session initrd does not start with the base initramfs")
	}
	if len(data)%4 != 0 {
		t.Errorf("session initrd length %d is not a multiple of 4", len(data))
	}
	es, err := initramfs.ReadArchive(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("ReadArchive: %v", err)
	}
	got := map[string]initramfs.Entry{}
	for _, e := range es {
		got[e.Name] = e
	}
	wants := []struct {
		name string
		mode fs.FileMode
		data []byte
	}{
		{"vibedom", fs.ModeDir | 0o755, nil},
		{strings.TrimPrefix(proto.BootConfigPath, "/"), 0o644, files[0].Data},
		{strings.TrimPrefix(proto.HostKeyPath, "/"), 0o600, fakeHostKey()},
		{strings.TrimPrefix(proto.CACertPath, "/"), 0o644, fakeCA()},
		{"init", fs.ModeSymlink | 0o777, []byte(proto.GuestBinaryPath)},
		{"tmp", fs.ModeDir | fs.ModeSticky | 0o777, nil},
	}
	for _, w := range wants {
		t.Run(w.name, func(t *testing.T) {
			e, ok := got[w.name]
			if !ok {
				t.Fatalf("missing")
			}
			if e.Mode != w.mode || e.UID != 0 || e.GID != 0 {
				t.Errorf("got %v %d:%d, want %v 0:0", e.Mode, e.UID, e.GID, w.mode)
			}
			if w.data != nil && !bytes.Equal(e.Data, w.data) {
				t.Errorf("content differs")
			}
		})
	}
	t.Run("no leftovers", func(t *testing.T) {
		ents, _ := os.ReadDir(filepath.Dir(dst))
		if len(ents) != 1 {
			t.Errorf("session dir holds %d entries, want only the initrd", len(ents))
		}
	})
	t.Run("rewrite replaces", func(t *testing.T) {
		if err := WriteSessionInitrd(dst, base, files[:1]); err != nil {
			t.Fatal(err)
		}
		es, _ := initramfs.ReadArchive(mustOpen(t, dst))
		for _, e := range es {
			if e.Name == strings.TrimPrefix(proto.HostKeyPath, "/") {
				t.Errorf("old host key still in the rewritten initrd")
			}
		}
	})
	t.Run("replacing /init", func(t *testing.T) {
		script := initramfs.File{Path: "/init", Mode: 0o755, Data: []byte("#!/bin/busybox sh\n")}
		if err := WriteSessionInitrd(dst, base, []initramfs.File{script}); err != nil {
			t.Fatal(err)
		}
		es, _ := initramfs.ReadArchive(mustOpen(t, dst))
		last := es[len(es)-1]
		if last.Name != "init" || last.Mode != 0o755 {
			t.Errorf("last member: got %s %v, want init -rwxr-xr-x", last.Name, last.Mode)
		}
	})
	t.Run("base changed size", func(t *testing.T) {
		b := *base
		b.InitrdSize++
		err := WriteSessionInitrd(filepath.Join(t.TempDir(), "x"), &b, files)
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("got %v, want ErrCorrupt", err)
		}
	})
}

func mustOpen(t *testing.T, p string) *os.File {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestSessionArchiveRefuses covers session files that would escape the
// boot data directory or change the base image's directories.
func TestSessionArchiveRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		file initramfs.File
	}{
		{"relative", initramfs.File{Path: "vibedom/boot.json", Mode: 0o644}},
		{"dot dot", initramfs.File{Path: "/vibedom/../etc/passwd", Mode: 0o644}},
		{"climbing", initramfs.File{Path: "/../../etc/passwd", Mode: 0o644}},
		{"into tmp", initramfs.File{Path: "/tmp/x", Mode: 0o644}},
		{"into etc", initramfs.File{Path: "/etc/ssl/certs/ca.pem", Mode: 0o644}},
		{"nested", initramfs.File{Path: "/vibedom/sub/x", Mode: 0o644}},
		{"the directory itself", initramfs.File{Path: "/vibedom", Mode: 0o644}},
		{"setuid", initramfs.File{Path: "/vibedom/x", Mode: fs.ModeSetuid | 0o755}},
		{"directory mode", initramfs.File{Path: "/vibedom/x", Mode: fs.ModeDir | 0o755}},
		{"symlink mode", initramfs.File{Path: "/vibedom/x", Mode: fs.ModeSymlink | 0o777}},
		{"trailer", initramfs.File{Path: "/TRAILER!!!", Mode: 0o644}},
		{"root", initramfs.File{Path: "/", Mode: 0o644}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := initramfs.SessionArchive([]initramfs.File{tt.file}); err == nil {
				t.Errorf("SessionArchive accepted %v", tt.file)
			}
			dst := filepath.Join(t.TempDir(), "initrd")
			if err := WriteSessionInitrd(dst, fakeBase(t), []initramfs.File{tt.file}); err == nil {
				t.Errorf("WriteSessionInitrd accepted %v", tt.file)
			}
			if _, err := os.Stat(dst); err == nil {
				t.Errorf("a refused initrd was written")
			}
		})
	}
}
