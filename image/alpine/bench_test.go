package alpine_test

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
)

// BenchmarkVerifyFile measures verifying a 16 MiB package that compresses about as well as program files:
// the cost of every cache hit.
func BenchmarkVerifyFile(b *testing.B) {
	// Half random bytes, half text: compresses like a binary package.
	body := make([]byte, 16<<20)
	rand.Read(body)
	for i := 0; i < len(body); i += 2 {
		body[i] = 'a' + body[i]%8
	}
	apk, p := buildAPK(b, alpinetest.Spec{Name: "big", Version: "1-r0", Arch: "x86_64", Files: []alpinetest.File{{Name: "big", Body: body}}})
	path := filepath.Join(b.TempDir(), p.File())
	os.WriteFile(path, apk, 0o644)
	lp := alpine.LockedPackage{Name: p.Name, Version: p.Version, Arch: p.Arch, Repo: "main", Checksum: p.Checksum, Size: p.Size}
	ring := testRing(b)
	b.SetBytes(p.Size)
	b.ResetTimer()
	for range b.N {
		if err := alpine.VerifyFile(path, "x86_64", lp, ring); err != nil {
			b.Fatal(err)
		}
	}
}
