package assets

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/vibedom/vibedom/vm"
)

// guestFS is an embedded-agents tree holding agent for amd64, with sums
// as its SHA256SUMS ("" means the right hash).
func guestFS(agent, sums string) fstest.MapFS {
	if sums == "" {
		sum := sha256.Sum256([]byte(agent))
		sums = hex.EncodeToString(sum[:]) + "  vibedom-guest-linux-amd64\n"
	}
	return fstest.MapFS{
		"vibedom-guest-linux-amd64": {Data: []byte(agent), Mode: 0o755},
		EmbeddedSumsFile:            {Data: []byte(sums)},
	}
}

func TestExtractGuest(t *testing.T) {
	const agent = "\x7fELF the guest agent"
	sum := sha256.Sum256([]byte(agent))
	want := "vibedom-guest-linux-amd64-" + hex.EncodeToString(sum[:])

	t.Run("extracts into a private folder, named by hash", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "cache", "guest-agent")
		p, err := extractGuest(guestFS(agent, ""), dir, vm.ArchAMD64)
		if err != nil {
			t.Fatal(err)
		}
		if p != filepath.Join(dir, want) {
			t.Errorf("path %s, want %s", p, filepath.Join(dir, want))
		}
		if b, _ := os.ReadFile(p); string(b) != agent {
			t.Errorf("content %q", b)
		}
		for path, mode := range map[string]os.FileMode{dir: 0o700, filepath.Dir(dir): 0o700, p: 0o700} {
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
				t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode().Perm(), err, mode)
			}
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 {
			t.Errorf("folder holds %d entries, want the agent only", len(ents))
		}
	})

	t.Run("a tampered copy is replaced", func(t *testing.T) {
		dir := t.TempDir()
		os.Chmod(dir, 0o755)
		if err := os.WriteFile(filepath.Join(dir, want), []byte("evil"), 0o700); err != nil {
			t.Fatal(err)
		}
		p, err := extractGuest(guestFS(agent, ""), dir, vm.ArchAMD64)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != agent {
			t.Errorf("content %q, want the embedded agent", b)
		}
		if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
			t.Errorf("folder mode %v, want 0700", fi.Mode().Perm())
		}
	})

	t.Run("a symlink planted at the path is replaced, its target untouched", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(t.TempDir(), "victim")
		os.WriteFile(target, []byte("keep"), 0o600)
		if err := os.Symlink(target, filepath.Join(dir, want)); err != nil {
			t.Fatal(err)
		}
		p, err := extractGuest(guestFS(agent, ""), dir, vm.ArchAMD64)
		if err != nil {
			t.Fatal(err)
		}
		if fi, _ := os.Lstat(p); !fi.Mode().IsRegular() {
			t.Errorf("%s is %v, want a regular file", p, fi.Mode())
		}
		if b, _ := os.ReadFile(target); string(b) != "keep" {
			t.Errorf("symlink target written: %q", b)
		}
	})

	// An intact copy that someone else can still write to (planted while
	// the folder was group-writable: a hard link to their own file, a
	// file of theirs, or one open to writes) is replaced, not used: they
	// could change it between the check and the boot image's build.
	planted := []struct {
		name  string
		plant func(t *testing.T, p string) string // returns the attacker's own path
		root  bool
	}{
		{"hard link to a file outside", func(t *testing.T, p string) string {
			outside := filepath.Join(t.TempDir(), "theirs")
			os.WriteFile(outside, []byte(agent), 0o755)
			if err := os.Link(outside, p); err != nil {
				t.Fatal(err)
			}
			return outside
		}, false},
		{"writable by others", func(t *testing.T, p string) string {
			os.WriteFile(p, []byte(agent), 0o700)
			os.Chmod(p, 0o777)
			return p
		}, false},
		{"another user's", func(t *testing.T, p string) string {
			os.WriteFile(p, []byte(agent), 0o700)
			if err := os.Lchown(p, os.Getuid()+4242, -1); err != nil {
				t.Fatal(err)
			}
			return p
		}, true},
	}
	for _, tc := range planted {
		t.Run("an intact copy "+tc.name+" is replaced", func(t *testing.T) {
			if tc.root && os.Getuid() != 0 {
				t.Skip("giving a file to another user needs root")
			}
			dir := t.TempDir()
			os.Chmod(dir, 0o775)
			theirs := tc.plant(t, filepath.Join(dir, want))
			before, _ := os.Stat(theirs)
			p, err := extractGuest(guestFS(agent, ""), dir, vm.ArchAMD64)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(p)
			if err != nil || os.SameFile(fi, before) {
				t.Fatalf("%s is still the planted file (%v)", p, err)
			}
			if fi.Mode().Perm() != 0o700 {
				t.Errorf("mode %v, want 0700", fi.Mode().Perm())
			}
			if b, _ := os.ReadFile(p); string(b) != agent {
				t.Errorf("content %q", b)
			}
		})
	}

	// A folder above the cache that someone else can write to lets them
	// rename the checked cache folder away and put their own in its place
	// before the agent is used.
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, shared string)
		root bool
	}{
		{"writable by all", func(t *testing.T, shared string) { os.Chmod(shared, 0o777) }, false},
		{"group-writable", func(t *testing.T, shared string) { os.Chmod(shared, 0o775) }, false},
		{"another user's", func(t *testing.T, shared string) {
			if err := os.Lchown(shared, os.Getuid()+4242, -1); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		t.Run("a parent folder "+tc.name+" is refused", func(t *testing.T) {
			if tc.root && os.Getuid() != 0 {
				t.Skip("giving a folder to another user needs root")
			}
			shared := filepath.Join(t.TempDir(), "shared")
			os.Mkdir(shared, 0o755)
			tc.edit(t, shared)
			dir := filepath.Join(shared, "cache", "guest-agent")
			_, err := extractGuest(guestFS(agent, ""), dir, vm.ArchAMD64)
			if !errors.Is(err, ErrEmbeddedGuest) || !strings.Contains(err.Error(), shared) {
				t.Errorf("err = %v, want ErrEmbeddedGuest naming %s", err, shared)
			}
		})
	}

	t.Run("a cache folder that is a symlink is refused", func(t *testing.T) {
		tmp := t.TempDir()
		elsewhere := filepath.Join(tmp, "elsewhere")
		os.Mkdir(elsewhere, 0o700)
		dir := filepath.Join(tmp, "guest-agent")
		os.Symlink(elsewhere, dir)
		_, err := extractGuest(guestFS(agent, ""), dir, vm.ArchAMD64)
		if !errors.Is(err, ErrEmbeddedGuest) || !strings.Contains(err.Error(), "not a folder") {
			t.Errorf("err = %v, want ErrEmbeddedGuest: not a folder", err)
		}
		if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
			t.Errorf("wrote through the symlink: %v", ents)
		}
	})

	bad := []struct {
		name, sums, arch, wantMsg string
	}{
		{"hash mismatch", strings.Repeat("0", 64) + "  vibedom-guest-linux-amd64\n", "amd64", "does not match its recorded hash"},
		{"no line for the arch", "", "arm64", "no guest agent for arm64"},
		{"malformed hash", "xyz  vibedom-guest-linux-amd64\n", "amd64", "no guest agent for amd64"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "g")
			_, err := extractGuest(guestFS(agent, tc.sums), dir, vm.Arch(tc.arch))
			if !errors.Is(err, ErrEmbeddedGuest) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("err = %v, want ErrEmbeddedGuest containing %q", err, tc.wantMsg)
			}
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("%s made for a refused agent", dir)
			}
		})
	}
}

// TestLocateGuestPrefersEmbedded: a binary carrying its agent uses it, not
// a bin/vibedom-guest-linux-* found walking up from the current directory
// (a checkout, or a workspace that plants one).
func TestLocateGuestPrefersEmbedded(t *testing.T) {
	const agent = "\x7fELF embedded"
	tmp := t.TempDir()
	touchFile(t, filepath.Join(tmp, "ws", "bin", "vibedom-guest-linux-amd64"))
	t.Chdir(filepath.Join(tmp, "ws"))
	t.Setenv(EnvHome, filepath.Join(tmp, "home"))
	t.Setenv(EnvGuestBin, "")
	old := embeddedGuests
	embeddedGuests = guestFS(agent, "")
	t.Cleanup(func() { embeddedGuests = old })
	p, err := LocateGuest(vm.ArchAMD64)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p, filepath.Join(tmp, "home", "cache", "guest-agent")+string(filepath.Separator)) {
		t.Errorf("LocateGuest = %s, want the extracted agent under the home", p)
	}
	if b, _ := os.ReadFile(p); string(b) != agent {
		t.Errorf("content %q", b)
	}
}

// TestReleaseKernelNotFromWorkingDir: a release build does not take the
// kernel from a .cache/assets planted in the folder it runs in (a cloned
// project), where a development build run in a checkout does.
func TestReleaseKernelNotFromWorkingDir(t *testing.T) {
	tmp := t.TempDir()
	planted := filepath.Join(tmp, "ws", ".cache", "assets", "amd64")
	if err := os.MkdirAll(filepath.Join(planted, "kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	touchFile(t, filepath.Join(planted, "busybox"))
	t.Chdir(filepath.Join(tmp, "ws"))
	t.Setenv(EnvHome, filepath.Join(tmp, "home"))
	t.Setenv(EnvAssets, "")

	kdir, _, err := LocateKernel(vm.ArchAMD64)
	if err != nil || kdir != filepath.Join(planted, "kernel") {
		t.Fatalf("development build: LocateKernel = %q, %v; want the checkout's %s", kdir, err, planted)
	}
	old := embeddedGuests
	embeddedGuests = guestFS("\x7fELF embedded", "")
	t.Cleanup(func() { embeddedGuests = old })
	if kdir, _, err := LocateKernel(vm.ArchAMD64); err == nil && strings.HasPrefix(kdir, filepath.Join(tmp, "ws")) {
		t.Errorf("release build: LocateKernel = %q, the kernel planted in the working folder", kdir)
	}
}
