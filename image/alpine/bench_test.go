package alpine

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
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
	apk, p := buildAPK(b, apkSpec{name: "big", version: "1-r0", arch: "x86_64", files: []tent{{name: "big", body: string(body)}}})
	path := filepath.Join(b.TempDir(), p.File())
	os.WriteFile(path, apk, 0o644)
	lp := LockedPackage{Name: p.Name, Version: p.Version, Arch: p.Arch, Repo: "main", Checksum: p.Checksum, Size: p.Size}
	ring := testRing(b)
	b.SetBytes(p.Size)
	b.ResetTimer()
	for range b.N {
		if err := VerifyFile(path, "x86_64", lp, ring); err != nil {
			b.Fatal(err)
		}
	}
}
