package alpinetest

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vibedom/vibedom/image/alpine"
)

type sink map[string]string

func (s sink) WriteEntry(e alpine.Entry, r io.Reader) error {
	b, err := io.ReadAll(r)
	s[e.Path] = string(b)
	return err
}

// keyAndMirror makes a key named name and an empty mirror.
func keyAndMirror(t *testing.T, name string) (*Key, *Mirror) {
	t.Helper()
	k, err := NewKey(name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMirror(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return k, m
}

// TestMirrorRoundTrip: what this package builds, package alpine reads,
// verifies, resolves, fetches and extracts; and trusts nothing else.
func TestMirrorRoundTrip(t *testing.T) {
	t.Parallel()
	k, m := keyAndMirror(t, "round@trip-1.rsa.pub")
	if _, err := m.Build("main", Spec{Name: "app", Version: "1.0-r0", Arch: "x86_64", Description: "the app",
		Depends: []string{"so:libz.so.1"}, Key: k,
		Files: []File{{Name: "usr/", Type: tar.TypeDir}, {Name: "usr/bin/app", Mode: 0o755, Body: []byte("#!/bin/sh\n")}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Build("main", Spec{Name: "zlib", Version: "1.3-r0", Arch: "x86_64", Provides: []string{"so:libz.so.1=1.3"}, Key: k}); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteIndexes("x86_64", k, "test"); err != nil {
		t.Fatal(err)
	}
	srv := m.Serve()
	defer srv.Close()
	o := m.Options(srv.URL, "x86_64", k)
	idx, err := alpine.FetchIndexes(t.Context(), nil, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(idx) != len(alpine.Repositories) || idx[0].Packages[0].Description != "the app" {
		t.Fatalf("indexes %+v", idx)
	}
	lock, err := alpine.Resolve(idx, []string{"app"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	paths, err := alpine.Fetch(t.Context(), alpine.FetchOptions{Options: o, CacheDir: t.TempDir()}, lock)
	if err != nil {
		t.Fatal(err)
	}
	got := sink{}
	for i, p := range lock.Packages {
		if err := alpine.Extract(paths[i], "x86_64", p, k.Ring, got); err != nil {
			t.Fatal(err)
		}
	}
	if got["usr/bin/app"] != "#!/bin/sh\n" || got["usr/share/zlib"] != "hello from zlib" {
		t.Errorf("extracted %v", got)
	}
	// The same index under the release keys, or signed by another key
	// under this key's name, is refused.
	o.Keys = nil
	if _, err := alpine.FetchIndexes(t.Context(), nil, o); !errors.Is(err, alpine.ErrSignature) {
		t.Errorf("release keys accepted a test index: %v", err)
	}
	forger, _ := NewKey(k.Name)
	if err := m.WriteIndex("main", "x86_64", forger, "forged"); err != nil {
		t.Fatal(err)
	}
	if _, err := alpine.FetchIndexes(t.Context(), nil, m.Options(srv.URL, "x86_64", k)); !errors.Is(err, alpine.ErrSignature) {
		t.Errorf("forged index: %v", err)
	}
}

func TestMembers(t *testing.T) {
	t.Parallel()
	k, _ := NewKey("m-1.rsa.pub")
	apk, _, err := BuildAPK(Spec{Name: "a", Version: "1-r0", Arch: "aarch64", Key: k})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := Members(apk)
	if err != nil || len(ms) != 3 || !bytes.Equal(bytes.Join(ms, nil), apk) {
		t.Fatalf("%d members, %v", len(ms), err)
	}
	if _, err := Members(apk[:len(apk)-3]); err == nil {
		t.Error("a truncated file split cleanly")
	}
	if _, _, err := BuildAPK(Spec{Name: "a", Version: "1-r0", Arch: "aarch64"}); err == nil {
		t.Error("built a package with no key")
	}
}

// TestMirrorClone: a clone starts as the mirror it copies, and a package
// or index written to either afterwards is not seen by the other.
func TestMirrorClone(t *testing.T) {
	t.Parallel()
	k, m := keyAndMirror(t, "clone-1.rsa.pub")
	if _, err := m.Build("main", Spec{Name: "app", Version: "1.0-r0", Arch: "x86_64", Key: k}); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteIndexes("x86_64", k, "original"); err != nil {
		t.Fatal(err)
	}
	c, err := m.Clone(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	index := func(m *Mirror) string {
		b, err := os.ReadFile(filepath.Join(m.Dir("main", "x86_64"), alpine.IndexFile))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	names := func(m *Mirror) (out []string) {
		for _, p := range m.Packages("main", "x86_64") {
			out = append(out, p.String())
		}
		return out
	}
	before := index(m)
	if index(c) != before || !slices.Equal(names(c), names(m)) {
		t.Fatalf("clone differs from its mirror: %v, %v", names(c), names(m))
	}
	if _, err := c.Build("main", Spec{Name: "app", Version: "2.0-r0", Arch: "x86_64", Key: k}); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteIndexes("x86_64", k, "changed"); err != nil {
		t.Fatal(err)
	}
	if index(m) != before || !slices.Equal(names(m), []string{"app-1.0-r0"}) {
		t.Errorf("the clone's change reached the mirror: %v", names(m))
	}
	if _, err := os.Stat(filepath.Join(m.Dir("main", "x86_64"), "app-2.0-r0.apk")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the clone's package is in the mirror: %v", err)
	}
	if index(c) == before || !slices.Equal(names(c), []string{"app-1.0-r0", "app-2.0-r0"}) {
		t.Errorf("the clone did not change: %v", names(c))
	}
	// And the other way round.
	changed := index(c)
	if err := m.WriteIndexes("x86_64", k, "original, again"); err != nil {
		t.Fatal(err)
	}
	if index(c) != changed {
		t.Error("the mirror's change reached the clone")
	}
}
