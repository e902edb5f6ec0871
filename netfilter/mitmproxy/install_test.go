package mitmproxy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// tarEntry is one entry of a test tarball.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

// fakeMitmproxyScript prints a version like mitmdump does.
const fakeMitmproxyScript = "#!/bin/sh\necho 'Mitmproxy: " + Release + "'\necho 'Python:    3.12.0'\n"

// goodMitmproxyTree is a linux-x86_64 tarball's layout, with fake
// programs.
func goodMitmproxyTree() []tarEntry {
	return []tarEntry{
		{name: "mitmproxy", body: fakeMitmproxyScript, mode: 0o755},
		{name: "mitmdump", body: fakeMitmproxyScript, mode: 0o755},
		{name: "mitmweb", body: fakeMitmproxyScript, mode: 0o755},
	}
}

func makeTarball(t testing.TB, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Typeflag: e.typ, Linkname: e.link, Size: int64(len(e.body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// mitmproxyMirror serves tarball as the pinned linux-x86_64 release on
// loopback and counts the downloads.
func mitmproxyMirror(t *testing.T, tarball []byte, hits *atomic.Int64) string {
	t.Helper()
	return platformMirror(t, "linux-x86_64", tarball, hits)
}

func platformMirror(t *testing.T, platform string, tarball []byte, hits *atomic.Int64) string {
	t.Helper()
	want := "/" + Release + "/mitmproxy-" + Release + "-" + platform + ".tar.gz"
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != want {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		w.Write(tarball)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// installLeftovers lists what is in root but a complete install.
func installLeftovers(t *testing.T, root string) []string {
	t.Helper()
	ents, err := os.ReadDir(root)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestMitmproxyInstall: the pinned release, checked against its SHA-256,
// is unpacked into root/<version> and preferred over PATH; a second
// install downloads nothing.
func TestMitmproxyInstall(t *testing.T) {
	t.Parallel()
	tarball := makeTarball(t, goodMitmproxyTree())
	var hits atomic.Int64
	root := filepath.Join(t.TempDir(), DirName)
	o := InstallOptions{Root: root, Mirror: mitmproxyMirror(t, tarball, &hits), GOOS: "linux", GOARCH: "amd64", sha256: sha256Hex(tarball)}
	if PreferredMitmdump(root) != "" {
		t.Fatal("an install before installing")
	}
	in, err := Install(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Fresh || in.Version != Release || in.Mitmdump != filepath.Join(root, Release, "mitmdump") ||
		in.Mitmweb != filepath.Join(root, Release, "mitmweb") {
		t.Errorf("installed %+v", in)
	}
	if got := PreferredMitmdump(root); got != in.Mitmdump {
		t.Errorf("PreferredMitmdump = %q, want %q", got, in.Mitmdump)
	}
	if v, err := MitmdumpVersion(t.Context(), in.Mitmdump); err != nil || v != Release {
		t.Errorf("the installed mitmdump: %q %v", v, err)
	}
	if got := MitmwebProgram(in.Mitmdump, ""); got != in.Mitmweb {
		t.Errorf("mitmweb beside the installed mitmdump: %q", got)
	}
	if left := installLeftovers(t, root); len(left) != 1 || left[0] != Release {
		t.Errorf("root holds %v", left)
	}
	again, err := Install(t.Context(), o)
	if err != nil || again.Fresh || hits.Load() != 1 {
		t.Errorf("second install: fresh=%v err=%v downloads=%d", again.Fresh, err, hits.Load())
	}
}

// TestMitmproxyInstallMacOS: the macOS tarball's layout (an app bundle,
// with symlinks inside it) installs, and its programs are found in it.
func TestMitmproxyInstallMacOS(t *testing.T) {
	t.Parallel()
	const bin = "mitmproxy.app/Contents/MacOS/"
	tarball := makeTarball(t, []tarEntry{
		{name: "mitmproxy.app/", typ: tar.TypeDir, mode: 0o755},
		{name: bin + "mitmdump", body: fakeMitmproxyScript, mode: 0o755},
		{name: bin + "mitmweb", body: fakeMitmproxyScript, mode: 0o755},
		{name: "mitmproxy.app/Contents/Resources/lib.so", body: "lib"},
		{name: "mitmproxy.app/Contents/Frameworks/lib.so", typ: tar.TypeSymlink, link: "../Resources/lib.so"},
	})
	var hits atomic.Int64
	root := filepath.Join(t.TempDir(), DirName)
	in, err := Install(t.Context(), InstallOptions{Root: root, Mirror: platformMirror(t, "macos-arm64", tarball, &hits),
		GOOS: "darwin", GOARCH: "arm64", sha256: sha256Hex(tarball)})
	if err != nil {
		t.Fatal(err)
	}
	if in.Mitmdump != filepath.Join(root, Release, filepath.FromSlash(bin), "mitmdump") || PreferredMitmdump(root) != in.Mitmdump {
		t.Errorf("installed %+v", in)
	}
	if b, err := os.ReadFile(filepath.Join(in.Dir, "mitmproxy.app", "Contents", "Frameworks", "lib.so")); err != nil || string(b) != "lib" {
		t.Errorf("the bundle's symlink: %q %v", b, err)
	}
}

// TestMitmproxyInstallRefused: a wrong checksum, a tarball with entries
// that would land outside the install folder, or one over the limits
// installs nothing; the error is one line.
func TestMitmproxyInstallRefused(t *testing.T) {
	t.Parallel()
	good := goodMitmproxyTree()
	with := func(extra ...tarEntry) []tarEntry { return append(append([]tarEntry{}, good...), extra...) }
	for _, tt := range []struct {
		name    string
		entries []tarEntry
		badSum  bool
		maxTree int64
		want    string
	}{
		{name: "bad checksum", entries: good, badSum: true, want: "SHA-256"},
		{name: "dot-dot entry", entries: with(tarEntry{name: "../escape", body: "x"}), want: "outside the install folder"},
		{name: "nested dot-dot entry", entries: with(tarEntry{name: "a/../../escape", body: "x"}), want: "outside the install folder"},
		{name: "absolute entry", entries: with(tarEntry{name: "/tmp/escape", body: "x"}), want: "outside the install folder"},
		{name: "symlink out", entries: with(tarEntry{name: "lib", typ: tar.TypeSymlink, link: "../../etc"}), want: "points outside"},
		{name: "absolute symlink", entries: with(tarEntry{name: "lib", typ: tar.TypeSymlink, link: "/etc"}), want: "points outside"},
		{name: "through a symlink", entries: with(tarEntry{name: "d", typ: tar.TypeSymlink, link: "."},
			tarEntry{name: "d/s", typ: tar.TypeSymlink, link: "../x"}), want: "goes through the symlink"},
		{name: "hard link", entries: with(tarEntry{name: "h", typ: tar.TypeLink, link: "mitmdump"}), want: "hard link"},
		{name: "device", entries: with(tarEntry{name: "null", typ: tar.TypeChar}), want: "device"},
		{name: "too big", entries: good, maxTree: 100, want: "unpacks to more than"},
		{name: "no mitmweb", entries: good[:2], want: "no executable mitmweb"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tarball := makeTarball(t, tt.entries)
			var hits atomic.Int64
			root := filepath.Join(t.TempDir(), DirName)
			sum := sha256Hex(tarball)
			if tt.badSum {
				sum = sha256Hex([]byte("something else"))
			}
			_, err := Install(t.Context(), InstallOptions{Root: root, Mirror: mitmproxyMirror(t, tarball, &hits),
				GOOS: "linux", GOARCH: "amd64", sha256: sum, maxTree: tt.maxTree})
			if !errors.Is(err, ErrInstall) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("not one line: %q", err)
			}
			if left := installLeftovers(t, root); len(left) != 0 {
				t.Errorf("left in root: %v", left)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(root), "escape")); err == nil {
				t.Error("a file was written outside the install folder")
			}
			if PreferredMitmdump(root) != "" {
				t.Error("a refused install is preferred over PATH")
			}
		})
	}
}

// TestMitmproxyInstallPlatforms: an unpinned platform, or a pinned one
// without a checksum, is refused before anything is fetched.
func TestMitmproxyInstallPlatforms(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	mirror := mitmproxyMirror(t, []byte("never served"), &hits)
	for _, tt := range []struct{ goos, goarch, want string }{
		{"windows", "amd64", "no mitmproxy standalone build is pinned for windows-amd64"},
		{"linux", "amd64", "pins no checksum"},
	} {
		t.Run(tt.goos+"-"+tt.goarch, func(t *testing.T) {
			if tt.want == "pins no checksum" && mitmproxyBuilds[1].sha256 != "" {
				t.Skip("the linux-x86_64 checksum is pinned")
			}
			_, err := Install(t.Context(), InstallOptions{Root: t.TempDir(), Mirror: mirror, GOOS: tt.goos, GOARCH: tt.goarch})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want %q", err, tt.want)
			}
		})
	}
	if hits.Load() != 0 {
		t.Error("a tarball was fetched")
	}
}
