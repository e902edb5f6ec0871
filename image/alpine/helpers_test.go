package alpine_test

import (
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
)

// Test keys are made at run time; none is stored in the repository. Both
// sign under testKeyName: evil is a forger who knows the trusted name.
var (
	keyOnce          sync.Once
	testKey, evilKey *alpinetest.Key
)

const testKeyName = "test@vibedom-1.rsa.pub"

func keys(t testing.TB) (*alpinetest.Key, *alpinetest.Key) {
	keyOnce.Do(func() {
		var err error
		if testKey, err = alpinetest.NewKey(testKeyName); err != nil {
			panic(err)
		}
		if evilKey, err = alpinetest.NewKey(testKeyName); err != nil {
			panic(err)
		}
	})
	return testKey, evilKey
}

// testRing trusts the test key under testKeyName for every arch.
func testRing(t testing.TB) *alpine.Keyring {
	k, _ := keys(t)
	return k.Ring
}

// buildAPK builds s, signed by the test key unless s.Key is set.
func buildAPK(t testing.TB, s alpinetest.Spec) ([]byte, *alpine.Package) {
	t.Helper()
	if s.Key == nil {
		s.Key, _ = keys(t)
	}
	b, p, err := alpinetest.BuildAPK(s)
	if err != nil {
		t.Fatal(err)
	}
	return b, p
}

// buildIndex returns an index of pkgs signed by k.
func buildIndex(t testing.TB, k *alpinetest.Key, pkgs []*alpine.Package, desc string) []byte {
	t.Helper()
	b, err := alpinetest.BuildIndex(k, pkgs, desc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// gzTar is alpinetest.GzipTar for tests.
func gzTar(t testing.TB, files []alpinetest.File, end bool) []byte {
	t.Helper()
	b, err := alpinetest.GzipTar(files, end)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dataMember returns the third gzip member of an apk.
func dataMember(t testing.TB, apk []byte) []byte {
	t.Helper()
	ms, err := alpinetest.Members(apk)
	if err != nil || len(ms) != 3 {
		t.Fatalf("%d members: %v", len(ms), err)
	}
	return ms[2]
}

// memFS is an EntryWriter that keeps entries in memory.
type memFS struct {
	entries []alpine.Entry
	content map[string]string
}

func (m *memFS) WriteEntry(e alpine.Entry, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if int64(len(b)) != e.Size {
		return fmt.Errorf("got %d bytes for %s, entry says %d", len(b), e.Path, e.Size)
	}
	if m.content == nil {
		m.content = map[string]string{}
	}
	m.entries = append(m.entries, e)
	m.content[e.Path] = string(b)
	return nil
}
