package alpine_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
	"github.com/vibedom/vibedom/progress"
)

// mirror is an alpinetest.Mirror on disk, served with optional
// per-request behaviour and a log of the Range headers it saw.
type mirror struct {
	*alpinetest.Mirror
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	ranges []string
	// serve, when set, handles a request for a package instead.
	serve func(w http.ResponseWriter, r *http.Request, body []byte) bool
}

func newMirror(t *testing.T) *mirror {
	am, err := alpinetest.NewMirror(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := &mirror{Mirror: am, t: t}
	files := am.Handler()
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		serve := m.serve
		if rg := r.Header.Get("Range"); rg != "" {
			m.ranges = append(m.ranges, rg)
		}
		m.mu.Unlock()
		if serve != nil && strings.HasSuffix(r.URL.Path, ".apk") {
			body, err := os.ReadFile(filepath.Join(am.Root, filepath.FromSlash(path.Clean("/"+r.URL.Path))))
			if err != nil {
				http.NotFound(w, r)
				return
			}
			if serve(w, r, body) {
				return
			}
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mirror) put(repo, arch, file string, b []byte) {
	if err := m.PutFile(repo, arch, file, b); err != nil {
		m.t.Fatal(err)
	}
}

// repoSet is a small consistent repository: app needs lib (through
// so:libapp.so.1) and sh (through /bin/sh, provided by two packages).
type repoSet struct {
	apks map[string][]byte
	pkgs []*alpine.Package
}

func makeRepo(t *testing.T, arch string, extra ...alpinetest.Spec) *repoSet {
	specs := append([]alpinetest.Spec{
		{Name: "app", Version: "1.2.0-r0", Arch: arch, Depends: []string{"so:libapp.so.1", "/bin/sh", "tool"}},
		{Name: "libapp", Version: "1.0-r3", Arch: arch, Provides: []string{"so:libapp.so.1=1"}},
		{Name: "busybox-binsh", Version: "1.36-r0", Arch: arch, Provides: []string{"/bin/sh", "cmd:sh=1.36-r0"}},
		{Name: "dash-binsh", Version: "0.5-r0", Arch: arch, Provides: []string{"/bin/sh"}},
		{Name: "tool", Version: "2.0-r0", Arch: arch},
		{Name: "tool", Version: "2.1-r0", Arch: arch},
	}, extra...)
	rs := &repoSet{apks: map[string][]byte{}}
	for _, s := range specs {
		b, p := buildAPK(t, s)
		rs.apks[p.File()] = b
		rs.pkgs = append(rs.pkgs, p)
	}
	return rs
}

func (m *mirror) publish(t *testing.T, arch string, rs *repoSet, key *alpinetest.Key, desc string) {
	m.put("main", arch, alpine.IndexFile, buildIndex(t, key, rs.pkgs, desc))
	m.put("community", arch, alpine.IndexFile, buildIndex(t, key, nil, desc))
	for f, b := range rs.apks {
		m.put("main", arch, f, b)
	}
}

func (m *mirror) opts(t *testing.T, arch string) alpine.Options {
	return alpine.Options{Mirror: m.srv.URL, Arch: arch, Keys: testRing(t)}
}

// cacheFiles lists every file under dir (the partial/ folder included).
func cacheFiles(t *testing.T, dir string) []string {
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			out = append(out, strings.TrimPrefix(p, dir+"/"))
		}
		return nil
	})
	return out
}

// TestPipeline drives index -> verify -> resolve -> fetch -> extract
// against a local mirror, then builds again with the mirror gone.
func TestPipeline(t *testing.T) {
	t.Parallel()
	k, _ := keys(t)
	m := newMirror(t)
	rs := makeRepo(t, "aarch64")
	m.publish(t, "aarch64", rs, k, "v3.24.0-1")
	o := m.opts(t, "aarch64")
	idx, err := alpine.FetchIndexes(t.Context(), nil, o)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := alpine.Resolve(idx, []string{"app"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range lock.Packages {
		got = append(got, p.String())
	}
	// busybox-binsh wins /bin/sh over dash-binsh: equal priority, lower name.
	want := "app-1.2.0-r0 busybox-binsh-1.36-r0 libapp-1.0-r3 tool-2.1-r0"
	if strings.Join(got, " ") != want {
		t.Fatalf("resolved %v, want %s", got, want)
	}
	cache := t.TempDir()
	var out bytes.Buffer
	fo := alpine.FetchOptions{Options: o, CacheDir: cache, Progress: progress.NewText(&out, false)}
	paths, err := alpine.Fetch(t.Context(), fo, lock)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "[4/4]") || !strings.Contains(out.String(), "4 packages") {
		t.Errorf("progress output:\n%s", out.String())
	}
	var fs memFS
	for i, p := range lock.Packages {
		if err := alpine.Extract(paths[i], "aarch64", p, o.Keys, &fs); err != nil {
			t.Fatal(err)
		}
	}
	if fs.content["usr/share/app"] != "hello from app" {
		t.Errorf("extracted %v", fs.content)
	}
	// A second build needs no network.
	m.srv.Close()
	again, err := alpine.Fetch(t.Context(), fo, lock)
	if err != nil {
		t.Fatalf("cached fetch with the mirror down: %v", err)
	}
	if strings.Join(again, ",") != strings.Join(paths, ",") {
		t.Errorf("paths changed: %v vs %v", again, paths)
	}
	// The lock reproduces from its own serialisation.
	l2, err := alpine.ParseLock(lock.Marshal())
	if err != nil || !bytes.Equal(l2.Marshal(), lock.Marshal()) {
		t.Fatalf("lock round trip: %v", err)
	}
}

// TestTamperMatrix: every way the mirror can lie fails closed, names the
// file, and leaves nothing in the cache.
func TestTamperMatrix(t *testing.T) {
	t.Parallel()
	k, evil := keys(t)
	good := makeRepo(t, "aarch64")
	lock := func(t *testing.T, m *mirror) *alpine.Lock {
		// Resolve against the honest index, then let the mirror lie about
		// the package bytes.
		idx, err := alpine.FetchIndexes(t.Context(), nil, m.opts(t, "aarch64"))
		if err != nil {
			t.Fatal(err)
		}
		l, err := alpine.Resolve(idx, []string{"tool"}, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	swapTool := func(t *testing.T, m *mirror, b []byte) {
		m.put("main", "aarch64", "tool-2.1-r0.apk", b)
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, m *mirror) *alpine.Lock // nil lock: the index step must fail
		want  error
		msg   string // what the error must say besides the file name
	}{
		{"index signed by another key", func(t *testing.T, m *mirror) *alpine.Lock {
			m.put("main", "aarch64", alpine.IndexFile, buildIndex(t, evil, good.pkgs, "x"))
			return nil
		}, alpine.ErrSignature, "does not verify"},
		{"index signed with an unknown key name", func(t *testing.T, m *mirror) *alpine.Lock {
			m.put("main", "aarch64", alpine.IndexFile, buildIndex(t, k.As("stranger.rsa.pub"), good.pkgs, "x"))
			return nil
		}, alpine.ErrSignature, "does not trust"},
		{"index truncated", func(t *testing.T, m *mirror) *alpine.Lock {
			b := buildIndex(t, k, good.pkgs, "x")
			m.put("main", "aarch64", alpine.IndexFile, b[:len(b)-20])
			return nil
		}, alpine.ErrFormat, "truncated"},
		{"package of another build (checksum)", func(t *testing.T, m *mirror) *alpine.Lock {
			l := lock(t, m)
			b, _ := buildAPK(t, alpinetest.Spec{Name: "tool", Version: "2.1-r0", Arch: "aarch64", Files: []alpinetest.File{{Name: "evil", Body: []byte("x")}}})
			swapTool(t, m, b)
			l.Packages[0].Size = int64(len(b)) // a same-size substitute
			return l
		}, alpine.ErrChecksum, "control checksum differs"},
		{"package longer than the index says (size)", func(t *testing.T, m *mirror) *alpine.Lock {
			l := lock(t, m)
			swapTool(t, m, append(append([]byte{}, good.apks["tool-2.1-r0.apk"]...), 0))
			return l
		}, alpine.ErrChecksum, "the index says"},
		{"package truncated on every attempt", func(t *testing.T, m *mirror) *alpine.Lock {
			l := lock(t, m)
			m.serve = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				w.Write(body[:len(body)/2])
				return true // the handler returns: the connection is cut short
			}
			return l
		}, nil, "truncated"},
		{"package for another arch", func(t *testing.T, m *mirror) *alpine.Lock {
			b, p := buildAPK(t, alpinetest.Spec{Name: "tool", Version: "2.1-r0", Arch: "aarch64", PKGINFOArch: "x86_64"})
			pkgs := append([]*alpine.Package{p}, good.pkgs[:4]...)
			m.put("main", "aarch64", alpine.IndexFile, buildIndex(t, k, pkgs, "x"))
			swapTool(t, m, b)
			return lock(t, m)
		}, alpine.ErrChecksum, "built for x86_64"},
		{"data member replaced (datahash)", func(t *testing.T, m *mirror) *alpine.Lock {
			l := lock(t, m)
			b := good.apks["tool-2.1-r0.apk"]
			other, _ := buildAPK(t, alpinetest.Spec{Name: "tool", Version: "2.1-r0", Arch: "aarch64", Files: []alpinetest.File{{Name: "usr/share/tool", Body: []byte("hello from evil")}}})
			// Keep the honest signature and control members, swap the data.
			head := len(b) - len(dataMember(t, b))
			swapTool(t, m, append(append([]byte{}, b[:head]...), dataMember(t, other)...))
			// Same size, so the size check alone cannot catch it.
			l.Packages[0].Size = int64(head + len(dataMember(t, other)))
			return l
		}, alpine.ErrChecksum, "datahash"},
		{"package signed by another key", func(t *testing.T, m *mirror) *alpine.Lock {
			b, p := buildAPK(t, alpinetest.Spec{Name: "tool", Version: "2.1-r0", Arch: "aarch64", Key: evil})
			pkgs := append([]*alpine.Package{p}, good.pkgs[:4]...)
			m.put("main", "aarch64", alpine.IndexFile, buildIndex(t, k, pkgs, "x"))
			swapTool(t, m, b)
			return lock(t, m)
		}, alpine.ErrSignature, "does not verify"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newMirror(t)
			m.publish(t, "aarch64", good, k, "v3.24.0-1")
			l := c.setup(t, m)
			cache := t.TempDir()
			var err error
			if l == nil {
				_, err = alpine.FetchIndexes(t.Context(), nil, m.opts(t, "aarch64"))
			} else {
				_, err = alpine.Fetch(t.Context(), alpine.FetchOptions{Options: m.opts(t, "aarch64"), CacheDir: cache}, l)
			}
			if err == nil {
				t.Fatal("accepted")
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
			file := "tool-2.1-r0.apk"
			if l == nil {
				file = alpine.IndexFile
			}
			if !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q does not name %s or say %q", err, file, c.msg)
			}
			for _, f := range cacheFiles(t, cache) {
				if !strings.HasPrefix(f, alpine.PartialDir+"/") || c.name != "package truncated on every attempt" {
					t.Errorf("left in the cache: %s", f)
				}
			}
			if l != nil {
				if _, err := os.Stat(alpine.CachePath(cache, l.Packages[0])); !os.IsNotExist(err) {
					t.Errorf("cache holds the package after a failure: %v", err)
				}
			}
		})
	}
}

// TestResumeAfterCut: the first download is cut half way; the next
// attempt asks for the rest with a Range request and the file verifies.
func TestResumeAfterCut(t *testing.T) {
	t.Parallel()
	k, _ := keys(t)
	m := newMirror(t)
	rs := makeRepo(t, "x86_64")
	m.publish(t, "x86_64", rs, k, "v3.24.0-1")
	var cuts atomic.Int32
	m.serve = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.Header.Get("Range") == "" && cuts.Add(1) == 1 {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.Write(body[:len(body)/2])
			return true
		}
		return false
	}
	o := m.opts(t, "x86_64")
	idx, err := alpine.FetchIndexes(t.Context(), nil, o)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := alpine.Resolve(idx, []string{"tool"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	half := len(rs.apks["tool-2.1-r0.apk"]) / 2
	if _, err := alpine.Fetch(t.Context(), alpine.FetchOptions{Options: o, CacheDir: t.TempDir()}, lock); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.ranges) != 1 || m.ranges[0] != "bytes="+itoa(half)+"-" {
		t.Errorf("Range requests %v, want one from byte %d", m.ranges, half)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestParallelBounded: with a slow server, Fetch has exactly Parallel
// downloads in flight at once, never more.
func TestParallelBounded(t *testing.T) {
	t.Parallel()
	k, _ := keys(t)
	var extra []alpinetest.Spec
	for _, n := range []string{"p1", "p2", "p3", "p4", "p5", "p6", "p7"} {
		extra = append(extra, alpinetest.Spec{Name: n, Version: "1-r0", Arch: "x86_64"})
	}
	m := newMirror(t)
	rs := makeRepo(t, "x86_64", extra...)
	m.publish(t, "x86_64", rs, k, "v3.24.0-1")
	const parallel = 3
	var inflight, peak atomic.Int32
	release := make(chan struct{})
	m.serve = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return false
	}
	o := m.opts(t, "x86_64")
	idx, err := alpine.FetchIndexes(t.Context(), nil, o)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := alpine.Resolve(idx, []string{"p1", "p2", "p3", "p4", "p5", "p6", "p7"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := alpine.Fetch(t.Context(), alpine.FetchOptions{Options: o, CacheDir: t.TempDir(), Parallel: parallel}, lock)
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for peak.Load() < parallel {
		if time.Now().After(deadline) {
			t.Fatalf("only %d downloads in flight", peak.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p := peak.Load(); p != parallel {
		t.Errorf("peak %d downloads in flight, want %d", p, parallel)
	}
}

// TestFetchRefusesOtherBranch: a lock made for another release is not
// fetched from this one's paths, nor one whose names would leave the cache.
func TestFetchRefusesOtherBranch(t *testing.T) {
	t.Parallel()
	l := &alpine.Lock{Branch: "v3.19", Arch: "x86_64"}
	fo := alpine.FetchOptions{Options: alpine.Options{Arch: "x86_64", Mirror: "http://127.0.0.1:1"}, CacheDir: t.TempDir()}
	bad := &alpine.Lock{Branch: alpine.Branch, Arch: "x86_64", Packages: []alpine.LockedPackage{{Name: "../../x", Version: "1-r0", Arch: "x86_64", Repo: "main", Checksum: "Q1" + strings.Repeat("A", 27) + "=", Size: 1}}}
	if _, err := alpine.Fetch(t.Context(), fo, bad); err == nil || !strings.Contains(err.Error(), "bad entry") {
		t.Errorf("a lock naming ../../x: %v", err)
	}
	_, err := alpine.Fetch(t.Context(), alpine.FetchOptions{Options: alpine.Options{Arch: "x86_64", Mirror: "http://127.0.0.1:1"}, CacheDir: t.TempDir()}, l)
	if err == nil || !strings.Contains(err.Error(), "--update") {
		t.Fatalf("err %v", err)
	}
}
