package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
)

// fakeMitmproxyTarball is a linux-x86_64 mitmproxy tarball with fake
// programs, plus extra entries.
func fakeMitmproxyTarball(t *testing.T, extra ...string) []byte {
	t.Helper()
	script := "#!/bin/sh\necho 'Mitmproxy: " + mitmproxy.Release + "'\n"
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, name := range append([]string{"mitmproxy", "mitmdump", "mitmweb"}, extra...) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(script)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(script))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// mitmproxyTestMirror serves tarball on loopback where the pinned
// linux-x86_64 release is looked for.
func mitmproxyTestMirror(t *testing.T, tarball []byte, hits *atomic.Int64) string {
	t.Helper()
	want := "/" + mitmproxy.Release + "/mitmproxy-" + mitmproxy.Release + "-linux-x86_64.tar.gz"
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

func hexSHA256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// errorLines are stderr's lines but init's progress line.
func errorLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if l != "" && !strings.HasPrefix(l, "Fetching mitmproxy") {
			out = append(out, l)
		}
	}
	return out
}

// TestInitWithMitmproxy: `vibedom init --with-mitmproxy` installs the
// pinned release from a mirror when its checksum matches (in a test build,
// which takes the expected checksum from the environment), and refuses a
// wrong checksum or a tarball with ../ entries with a one-line error,
// installing nothing. A release build ignores the test checksum.
func TestInitWithMitmproxy(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("the test mirror serves the linux-x86_64 tarball; this is %s-%s", runtime.GOOS, runtime.GOARCH)
	}
	good := fakeMitmproxyTarball(t)
	evil := fakeMitmproxyTarball(t, "../escape")
	for _, tt := range []struct {
		name    string
		release bool // the release build, not the test one
		tarball []byte
		sum     string
		flag    bool // --mitmproxy-mirror rather than $VIBEDOM_MITMPROXY_MIRROR
		want    string
	}{
		{name: "good checksum installs", tarball: good, sum: hexSHA256(good)},
		{name: "mirror flag", tarball: good, sum: hexSHA256(good), flag: true},
		{name: "bad checksum refused", tarball: good, sum: hexSHA256([]byte("another tarball")), want: "SHA-256"},
		{name: "dot-dot entry refused", tarball: evil, sum: hexSHA256(evil), want: "outside the install folder"},
		{name: "release build ignores the test checksum", release: true, tarball: good, sum: hexSHA256(good), want: "mitmproxy install: "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := clitest.New(t)
			var hits atomic.Int64
			mirror := mitmproxyTestMirror(t, tt.tarball, &hits)
			c.Env = append(c.Env, "VIBEDOM_TEST_MITMPROXY_SHA256="+tt.sum)
			args := []string{"init", "--no-image", "--json", "--with-mitmproxy"}
			if tt.flag {
				c.Env = append(c.Env, mitmproxy.MirrorEnv+"=http://127.0.0.1:9/closed")
				args = append(args, "--mitmproxy-mirror", mirror)
			} else {
				c.Env = append(c.Env, mitmproxy.MirrorEnv+"="+mirror)
			}
			bin := clitest.TestKeysBin(t)
			if tt.release {
				bin = clitest.Bin(t)
			}
			stdout, stderr, code := c.RunWith(t, bin, "", args...)
			root := filepath.Join(c.Home, mitmproxy.DirName)
			if tt.want != "" {
				lines := errorLines(stderr)
				if code == 0 || len(lines) != 1 || !strings.Contains(lines[0], tt.want) {
					t.Fatalf("exit %d, stderr %q: want one line with %q", code, stderr, tt.want)
				}
				t.Logf("refused: %s", lines[0])
				if ents, _ := os.ReadDir(root); len(ents) != 0 {
					t.Errorf("left in %s: %v", root, ents)
				}
				if _, err := os.Lstat(filepath.Join(c.Home, "escape")); err == nil {
					t.Error("a file was written outside the install folder")
				}
				return
			}
			if code != 0 && code != 1 {
				t.Fatalf("exit %d\n%s", code, stderr)
			}
			var out struct {
				Mitmproxy *mitmproxy.Installed `json:"mitmproxy"`
			}
			if err := json.Unmarshal([]byte(stdout), &out); err != nil || out.Mitmproxy == nil {
				t.Fatalf("init --json: %v\n%s", err, stdout)
			}
			m := out.Mitmproxy
			if m.Version != mitmproxy.Release || m.Mitmdump != filepath.Join(root, mitmproxy.Release, "mitmdump") ||
				m.SHA256 != tt.sum || !m.Fresh || hits.Load() != 1 {
				t.Errorf("installed %+v (downloads %d)", m, hits.Load())
			}
			if got := mitmproxy.PreferredMitmdump(root); got != m.Mitmdump {
				t.Errorf("the engine would run %q, not the installed %q", got, m.Mitmdump)
			}
		})
	}
}

// TestRunInspectFlags: --inspect is refused with --no-network, another
// engine or --quiet (which would hide the URL), and without mitmweb it is a one-line error saying what to do,
// all before anything boots.
func TestRunInspectFlags(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	script := "#!/bin/sh\necho 'Mitmproxy: 8.1.1'\n"
	if err := os.WriteFile(filepath.Join(bin, "mitmdump"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no network", []string{"--inspect", "--no-network"}, "--no-network gives it none"},
		{"go engine", []string{"--inspect", "--proxy-engine", "go"}, "drop --proxy-engine go"},
		{"quiet", []string{"--inspect", "--quiet"}, "drop --quiet"},
		{"no mitmweb", []string{"--inspect"}, "mitmweb not found"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := clitest.New(t)
			c.Env = append(c.Env, "PATH="+bin+string(os.PathListSeparator)+"/usr/bin/nonexistent")
			_, stderr, code := c.Run(t, "", append(append([]string{"run"}, tt.args...), t.TempDir())...)
			lines := errorLines(stderr)
			if code == 0 || len(lines) != 1 || !strings.Contains(lines[0], tt.want) {
				t.Errorf("exit %d, stderr %q: want one line with %q", code, stderr, tt.want)
			}
		})
	}
}
