package image

import (
	"path/filepath"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// BenchmarkSessionInitrd measures the per-session host-side work on the
// boot path: encoding the boot data and writing base initramfs + session
// archive into the session directory.
func BenchmarkSessionInitrd(b *testing.B) {
	base := sharedImage(b, vm.ArchAMD64)
	dst := filepath.Join(b.TempDir(), "initrd")
	b.SetBytes(base.InitrdSize)
	for b.Loop() {
		files, err := SessionFiles(testBootConfig(), fakeHostKey(), fakeCA())
		if err != nil {
			b.Fatal(err)
		}
		if err := WriteSessionInitrd(dst, base, files); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnsureWarm measures Ensure on a warm cache: declaring and
// digesting the inputs through the stat memo, and verifying the cached
// image (sizes and identities; no full hash).
func BenchmarkEnsureWarm(b *testing.B) {
	a := testAssets(b, vm.ArchAMD64)
	root := filepath.Join(sharedRoot, "images")
	r := NewDebianTest(a, nil)
	if _, err := Ensure(b.Context(), root, r); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Ensure(b.Context(), root, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnsureCold measures building the amd64 test image from scratch
// into an empty cache (module resolution, packing, hashing, fsync).
func BenchmarkEnsureCold(b *testing.B) {
	a := testAssets(b, vm.ArchAMD64)
	for b.Loop() {
		if _, err := Ensure(b.Context(), b.TempDir(), NewDebianTest(a, nil)); err != nil {
			b.Fatal(err)
		}
	}
}
