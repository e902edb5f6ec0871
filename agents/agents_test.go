package agents

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

func TestPinsTable(t *testing.T) {
	t.Parallel()
	if got := strings.Join(Names(), ","); got != "claude,codex,opencode" {
		t.Fatalf("Names() = %s", got)
	}
	dirs := map[string]bool{}
	for _, n := range Names() {
		for _, arch := range []string{ArchX86_64, ArchAArch64} {
			for _, libc := range []string{LibcMusl, LibcGlibc} {
				p, err := Lookup(n, arch, libc)
				if err != nil {
					t.Errorf("%s %s-%s: %v", n, arch, libc, err)
					continue
				}
				if err := p.validate(); err != nil {
					t.Error(err)
				}
				if p.Size < 1<<20 || p.Size > 512<<20 {
					t.Errorf("%s: size %d", p, p.Size)
				}
				if p.Binary == "" || path.Clean(p.Binary) != p.Binary || strings.HasPrefix(p.Binary, "/") || strings.HasPrefix(p.Binary, "..") {
					t.Errorf("%s: binary %q", p, p.Binary)
				}
				if dirs[p.Dir()] {
					t.Errorf("%s: directory %s twice", p, p.Dir())
				}
				dirs[p.Dir()] = true
				if strings.Contains(p.Version, "latest") || p.Version == "" {
					t.Errorf("%s: not an exact version", p)
				}
			}
		}
	}
	if len(dirs) != len(Pins) {
		t.Errorf("%d rows, %d reachable by Lookup", len(Pins), len(dirs))
	}
	_, err := Lookup("nope", ArchX86_64, LibcMusl)
	if !errors.Is(err, ErrUnknownAgent) || !strings.Contains(err.Error(), "claude, codex, opencode") {
		t.Errorf("Lookup(nope): %v", err)
	}
	if _, err := Lookup("claude", "riscv64", LibcMusl); err == nil {
		t.Errorf("Lookup(riscv64) found a pin")
	}
	got, err := ParseList(" claude,codex,,claude ")
	if err != nil || strings.Join(got, ",") != "claude,codex" {
		t.Errorf("ParseList = %v, %v", got, err)
	}
	if _, err := ParseList("claude,bash"); !errors.Is(err, ErrUnknownAgent) || strings.Count(err.Error(), "\n") > 0 {
		t.Errorf("ParseList(bash): %v", err)
	}
}

func TestPackumentURL(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"@anthropic-ai/claude-code-linux-x64": "https://r.example/@anthropic-ai%2Fclaude-code-linux-x64",
		"opencode-linux-x64":                  "https://r.example/opencode-linux-x64",
	} {
		if got := packumentURL("https://r.example", name); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
	p := Pin{Package: "@openai/codex", Version: "0.169.0-linux-x64"}
	if got := TarballName(p); got != "openai-codex-0.169.0-linux-x64.tgz" {
		t.Errorf("TarballName = %s", got)
	}
}

// assertNothingInstalled: no agent directory, no leftover temp directory,
// no verified tarball in the cache.
func assertNothingInstalled(t *testing.T, home string, p Pin, cacheMayHold bool) {
	t.Helper()
	ents, _ := os.ReadDir(AgentsDir(home))
	for _, e := range ents {
		if e.Name() != lockFile {
			t.Errorf("left in agents/: %s", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(CacheDir(home), TarballName(p))); err == nil && !cacheMayHold {
		t.Errorf("an unverified tarball is in the cache")
	}
	if _, err := Find(home, p); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("Find after a refused install: %v", err)
	}
}

func TestInstall(t *testing.T) {
	t.Parallel()
	_, p, reg := publishedAgent(t, "@fake/agent-linux-x64", "1.2.3")
	home := t.TempDir()
	o := Options{Home: home, Registry: reg.URL}
	res, err := Install(t.Context(), o, []Pin{p})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || !res[0].Fresh {
		t.Fatalf("result %+v", res)
	}
	i := res[0].Installed
	if i.Dir != filepath.Join(home, "agents", "fake-1.2.3-x86_64-musl") || i.Binary != "package/bin/agent" || i.Registry != reg.URL {
		t.Errorf("installed %+v", i)
	}
	b, err := os.ReadFile(i.BinaryPath())
	sum := sha256.Sum256(b)
	if err != nil || string(b) != "\x7fELF fake agent binary" || i.BinarySHA256 != hex.EncodeToString(sum[:]) || i.BinarySize != int64(len(b)) {
		t.Errorf("binary %q %v, manifest %s", b, err, i.BinarySHA256)
	}
	if got, _ := os.Readlink(filepath.Join(i.Dir, "package/lib/link")); got != "data.txt" {
		t.Errorf("symlink inside the package: %q", got)
	}
	// Read-only, setuid and world-write bits gone.
	for rel, want := range map[string]fs.FileMode{
		".": 0o555, "manifest.json": 0o444, "package": 0o555, "package/bin": 0o555,
		"package/bin/agent": 0o555, "package/lib/data.txt": 0o444, "package/package.json": 0o444,
	} {
		st, err := os.Lstat(filepath.Join(i.Dir, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		if got := st.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky); got != want {
			t.Errorf("%s: mode %v, want %v", rel, got, want)
		}
	}
	// Find and VerifyBinary agree; the manifest holds the pin.
	f, err := Find(home, p)
	if err != nil || f.VerifyBinary() != nil || f.Integrity != p.Integrity || f.Package != p.Package {
		t.Fatalf("Find: %+v %v", f, err)
	}
	// A second install needs no network at all.
	reg.Close()
	res, err = Install(t.Context(), o, []Pin{p})
	if err != nil || res[0].Fresh {
		t.Fatalf("second install: %+v %v", res, err)
	}
	// Without the agent directory, the cache alone installs it again.
	if err := removeTree(i.Dir); err != nil {
		t.Fatal(err)
	}
	res, err = Install(t.Context(), o, []Pin{p})
	if err != nil || !res[0].Fresh {
		t.Fatalf("install from the cache: %+v %v", res, err)
	}
	// A binary changed behind vibedom's back is noticed and replaced.
	os.Chmod(i.BinaryPath(), 0o755)
	os.WriteFile(i.BinaryPath(), []byte("\x7fELF evil fake agent!!"), 0o755)
	if err := res[0].VerifyBinary(); !errors.Is(err, ErrNotInstalled) {
		t.Errorf("VerifyBinary of a changed binary: %v", err)
	}
	res, err = Install(t.Context(), o, []Pin{p})
	if err != nil || !res[0].Fresh || res[0].VerifyBinary() != nil {
		t.Fatalf("reinstall over a changed binary: %+v %v", res, err)
	}
}

func TestInstallResumes(t *testing.T) {
	old := retryDelay
	retryDelay = 0
	t.Cleanup(func() { retryDelay = old })
	tgz, p, reg := publishedAgent(t, "fake-agent-linux-x64", "1.0.0")
	first := true
	reg.serve = func(w http.ResponseWriter, r *http.Request, body []byte) {
		if first {
			first = false
			cutAfter(len(body)/2)(w, r, body)
			return
		}
		http.ServeContent(w, r, "x.tgz", zeroTime, strings.NewReader(string(body)))
	}
	home := t.TempDir()
	if _, err := Install(t.Context(), Options{Home: home, Registry: reg.URL, Attempts: 2}, []Pin{p}); err != nil {
		t.Fatal(err)
	}
	if got := reg.ranges(); len(got) != 1 || got[0] != "bytes="+itoa(len(tgz)/2)+"-" {
		t.Errorf("ranges asked: %v", got)
	}
}

func TestTamper(t *testing.T) {
	old := retryDelay
	retryDelay = 0
	t.Cleanup(func() { retryDelay = old })
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a request reached another host: %s", r.URL)
	}))
	t.Cleanup(other.Close)

	good := goodTarball(t)
	type setup struct {
		pin        Pin    // what vibedom pins
		tgz        []byte // what the registry serves
		integrity  string // the packument's integrity ("" = the pin's)
		tarballURL string
		serve      func(http.ResponseWriter, *http.Request, []byte)
		maxUnpack  int64
	}
	pinned := func(tgz []byte) setup { return setup{pin: pinOf("fake-agent", "1.0.0", tgz, "bin/agent"), tgz: tgz} }
	hostile := func(es ...entry) setup {
		return pinned(tarball(t, append([]entry{{name: "package/bin/agent", body: "bin", mode: 0o755}}, es...)...))
	}
	cases := []struct {
		name    string
		s       setup
		want    error
		message []string // the error must name these
	}{
		{"served tarball differs from the pin", func() setup {
			s := pinned(good)
			s.tgz = append([]byte{}, good...)
			s.tgz[len(s.tgz)-9] ^= 1 // the gzip trailer's CRC: same length, other bytes
			return s
		}(), ErrIntegrity, []string{"fake-agent@1.0.0", "vibedom pins sha512-"}},
		{"packument integrity differs from the pin", func() setup {
			s := pinned(good)
			s.integrity = "sha512-" + base64.StdEncoding.EncodeToString(make([]byte, 64))
			return s
		}(), ErrIntegrity, []string{"fake-agent@1.0.0", "sha512-AAAA", "vibedom pins sha512-"}},
		{"packument integrity is sha1 only", func() setup {
			s := pinned(good)
			s.integrity = "sha1-AAAAAAAAAAAAAAAAAAAAAAAAAAA="
			return s
		}(), ErrIntegrity, nil},
		{"truncated download", func() setup {
			s := pinned(good)
			s.serve = cutAfter(len(good) / 3)
			return s
		}(), nil, []string{"cut off at", "run again to resume"}},
		{"more bytes than pinned", func() setup {
			s := pinned(good)
			s.tgz = append(append([]byte{}, good...), make([]byte, 100)...)
			return s
		}(), ErrIntegrity, []string{"pin says"}},
		{"tarball URL on another host", func() setup {
			s := pinned(good)
			s.tarballURL = other.URL + "/fake-agent/-/fake-agent-1.0.0.tgz"
			return s
		}(), ErrForeignHost, []string{other.URL}},
		{"tarball URL downgrades to another scheme", func() setup {
			s := pinned(good)
			s.tarballURL = "https://" + strings.TrimPrefix(other.URL, "http://") + "/x.tgz"
			return s
		}(), ErrForeignHost, nil},
		{"redirect to another host", func() setup {
			s := pinned(good)
			s.serve = func(w http.ResponseWriter, r *http.Request, _ []byte) {
				http.Redirect(w, r, other.URL+"/x.tgz", http.StatusFound)
			}
			return s
		}(), ErrForeignHost, nil},
		{"entry with ..", hostile(entry{name: "package/../../escape", body: "x"}), ErrUnsafeEntry, []string{"../../escape"}},
		{"absolute path", hostile(entry{name: "/etc/evil", body: "x"}), ErrUnsafeEntry, []string{"/etc/evil"}},
		{"second top directory", hostile(entry{name: "other/file", body: "x"}), ErrUnsafeEntry, nil},
		{"symlink out of the tree", hostile(entry{name: "package/l", typ: tar.TypeSymlink, linkname: "../../../../etc/passwd"}), ErrUnsafeEntry, nil},
		{"absolute symlink", hostile(entry{name: "package/l", typ: tar.TypeSymlink, linkname: "/etc"}), ErrUnsafeEntry, nil},
		{"file through a symlink", hostile(
			entry{name: "package/d", typ: tar.TypeSymlink, linkname: "bin"},
			entry{name: "package/d/x", body: "x"}), ErrUnsafeEntry, []string{"through"}},
		{"symlink chain out, link made first", hostile(
			entry{name: "package/s", typ: tar.TypeSymlink, linkname: "a/.."},
			entry{name: "package/a", typ: tar.TypeSymlink, linkname: "."}), ErrUnsafeEntry, nil},
		{"symlink through a symlink", hostile(
			entry{name: "package/a", typ: tar.TypeSymlink, linkname: "."},
			entry{name: "package/s", typ: tar.TypeSymlink, linkname: "a/.."}), ErrUnsafeEntry, nil},
		// On a Mac's file system "d/x" goes through the symlink "D".
		{"file through a symlink of another case", hostile(
			entry{name: "package/D", typ: tar.TypeSymlink, linkname: "bin"},
			entry{name: "package/d/x", body: "x"}), ErrUnsafeEntry, []string{"through"}},
		{"symlink through a symlink of another case", hostile(
			entry{name: "package/A", typ: tar.TypeSymlink, linkname: "."},
			entry{name: "package/s", typ: tar.TypeSymlink, linkname: "a/.."}), ErrUnsafeEntry, nil},
		{"names that differ only in case", hostile(
			entry{name: "package/Foo/x", body: "x"},
			entry{name: "package/foo/y", body: "y"}), ErrUnsafeEntry, []string{"case-insensitive"}},
		{"names that differ only in normalisation", hostile(
			entry{name: "package/caf\u00e9", body: "x"},
			entry{name: "package/cafe\u0301", body: "y"}), ErrUnsafeEntry, []string{"case-insensitive"}},
		{"names that differ by an ignorable character", hostile(
			entry{name: "package/bin\u200c/agent", body: "y", mode: 0o755}), ErrUnsafeEntry, []string{"case-insensitive"}},
		{"binary is a symlink", pinned(tarball(t,
			entry{name: "package/real", body: "x", mode: 0o755},
			entry{name: "package/bin/agent", typ: tar.TypeSymlink, linkname: "../real"})), ErrUnsafeEntry, nil},
		{"hard link", hostile(entry{name: "package/h", typ: tar.TypeLink, linkname: "package/bin/agent"}), ErrUnsafeEntry, nil},
		{"character device", hostile(entry{name: "package/dev", typ: tar.TypeChar}), ErrUnsafeEntry, nil},
		{"fifo", hostile(entry{name: "package/fifo", typ: tar.TypeFifo}), ErrUnsafeEntry, nil},
		{"duplicate entry", hostile(entry{name: "package/bin/agent", body: "evil", mode: 0o755}), ErrUnsafeEntry, []string{"twice"}},
		{"unpacks past the bound", func() setup {
			s := hostile(entry{name: "package/big", size: 2 << 20})
			s.maxUnpack = 1 << 20
			return s
		}(), ErrUnsafeEntry, []string{"MiB unpacked"}},
		{"no binary", pinned(tarball(t, entry{name: "package/README", body: "x"})), nil, []string{"no binary at bin/agent"}},
		{"binary not executable", pinned(tarball(t, entry{name: "package/bin/agent", body: "x", mode: 0o644})), nil, []string{"not executable"}},
		{"not gzip", pinned([]byte("this is not a tarball at all")), nil, []string{"not a gzip tarball"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg := newRegistry(t)
			reg.publish(c.s.pin, c.s.tgz, c.s.integrity, c.s.tarballURL)
			reg.serve = c.s.serve
			home := t.TempDir()
			_, err := Install(t.Context(), Options{Home: home, Registry: reg.URL, Attempts: 1, MaxUnpacked: c.s.maxUnpack}, []Pin{c.s.pin})
			if err == nil {
				t.Fatal("installed")
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
			for _, m := range c.message {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not say %q", err, m)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
			// A hostile package that matches its pin may stay cached;
			// a download that failed verification may not.
			failed := errors.Is(err, ErrIntegrity) || errors.Is(err, ErrForeignHost) || strings.Contains(err.Error(), "cut off")
			assertNothingInstalled(t, home, c.s.pin, !failed)
		})
	}
}

// A tampered cache is found at the moment of use: the tarball is
// fetched again rather than unpacked.
func TestTamperedCache(t *testing.T) {
	t.Parallel()
	tgz, p, reg := publishedAgent(t, "fake-agent", "1.0.0")
	home := t.TempDir()
	os.MkdirAll(CacheDir(home), 0o755)
	bad := append([]byte{}, tgz...)
	bad[len(bad)-8] ^= 1 // the gzip CRC
	os.WriteFile(filepath.Join(CacheDir(home), TarballName(p)), bad, 0o644)
	if _, err := Install(t.Context(), Options{Home: home, Registry: reg.URL}, []Pin{p}); err != nil {
		t.Fatal(err)
	}
	if reg.count(".tgz") != 1 {
		t.Errorf("the tampered cache was not fetched again")
	}
	// And a cache swapped between the check and the unpacking is caught
	// by the hash taken while unpacking.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "x.tgz"), bad, 0o644)
	os.Mkdir(filepath.Join(dir, "out"), 0o755)
	if _, err := unpackVerified(filepath.Join(dir, "x.tgz"), filepath.Join(dir, "out"), p, 1<<30); !errors.Is(err, ErrIntegrity) {
		t.Errorf("unpackVerified of a tampered file: %v", err)
	}
}

func TestBadRegistryURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"ftp://r.example", "registry.npmjs.org", "https://user:pw@r.example", "https://r.example/?q=1"} {
		if _, err := Install(t.Context(), Options{Home: t.TempDir(), Registry: u}, nil); err == nil {
			t.Errorf("registry %q accepted", u)
		}
	}
}

func TestInstalledNames(t *testing.T) {
	t.Parallel()
	tgz := goodTarball(t)
	reg := newRegistry(t)
	home := t.TempDir()
	var pins []Pin
	for _, a := range []string{"claude", "opencode"} {
		p := pinOf("fake-"+a, "1.0.0", tgz, "bin/agent")
		p.Agent = a
		reg.publish(p, tgz, "", "")
		pins = append(pins, p)
	}
	if _, err := Install(t.Context(), Options{Home: home, Registry: reg.URL}, pins); err != nil {
		t.Fatal(err)
	}
	got, err := InstalledNames(home, ArchX86_64, LibcMusl)
	if err != nil || strings.Join(got, ",") != "claude,opencode" {
		t.Errorf("InstalledNames = %v, %v", got, err)
	}
	if got, _ := InstalledNames(home, ArchAArch64, LibcMusl); len(got) != 0 {
		t.Errorf("aarch64: %v", got)
	}
	// An old version's directory does not satisfy the new pin.
	p2 := pins[0]
	p2.Version = "2.0.0"
	if _, err := Find(home, p2); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "vibedom init --agents claude") {
		t.Errorf("Find of a newer pin: %v", err)
	}
}

func TestInstallLocked(t *testing.T) {
	t.Parallel()
	_, p, reg := publishedAgent(t, "fake-agent", "1.0.0")
	home := t.TempDir()
	unlock, err := lockAgents(home)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Install(t.Context(), Options{Home: home, Registry: reg.URL}, []Pin{p}); err == nil || !strings.Contains(err.Error(), "another vibedom init") {
		t.Errorf("install beside a held lock: %v", err)
	}
	if reg.count("") != 0 {
		t.Errorf("the registry was asked while the lock was held")
	}
	unlock()
	if _, err := Install(t.Context(), Options{Home: home, Registry: reg.URL}, []Pin{p}); err != nil {
		t.Errorf("install after the lock was released: %v", err)
	}
}

func TestPackument(t *testing.T) {
	tgz := goodTarball(t)
	p := pinOf("fake-agent", "1.0.0", tgz, "bin/agent")
	for _, c := range []struct {
		name, doc, want string
	}{
		{"version missing", `{"versions":{"0.9.0":{"dist":{}}}}`, "has no fake-agent@1.0.0"},
		{"not JSON", `<html>`, "invalid character"},
		{"tarball not a URL", `{"versions":{"1.0.0":{"dist":{"integrity":"` + p.Integrity + `","tarball":"/x.tgz"}}}}`, "not a URL"},
		{"over the bound", `{"versions":{},"pad":"` + strings.Repeat("x", 2000) + `"}`, "over"},
	} {
		t.Run(c.name, func(t *testing.T) {
			old := maxPackument
			maxPackument = 1000
			t.Cleanup(func() { maxPackument = old })
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(c.doc)) }))
			defer srv.Close()
			home := t.TempDir()
			_, err := Install(t.Context(), Options{Home: home, Registry: srv.URL}, []Pin{p})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want %q", err, c.want)
			}
			assertNothingInstalled(t, home, p, false)
		})
	}
}

func TestInstallRefusesBadPins(t *testing.T) {
	t.Parallel()
	good := pinOf("fake-agent", "1.0.0", goodTarball(t), "bin/agent")
	for name, mod := range map[string]func(*Pin){
		"version with a slash": func(p *Pin) { p.Version = "1/../../x" },
		"binary leaves":        func(p *Pin) { p.Binary = "../x" },
		"binary absolute":      func(p *Pin) { p.Binary = "/bin/sh" },
		"no size":              func(p *Pin) { p.Size = 0 },
		"sha1 integrity":       func(p *Pin) { p.Integrity = "sha1-AAAAAAAAAAAAAAAAAAAAAAAAAAA=" },
	} {
		p := good
		mod(&p)
		home := t.TempDir()
		if _, err := Install(t.Context(), Options{Home: home, Registry: "http://127.0.0.1:1"}, []Pin{p}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
