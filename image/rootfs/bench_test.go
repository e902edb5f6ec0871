package rootfs_test

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
	"github.com/vibedom/vibedom/image/rootfs"
)

// BenchmarkBuildDefaultSized builds a root image from 40 synthetic packages
// holding about 820 MB in 16,000 files (a third of each file random, the
// rest text): more than twice what the default package set installs. It
// reports MB/s and the time a build takes; issue 10's target for the
// default set is under 30 s.
func BenchmarkBuildDefaultSized(b *testing.B) {
	key, err := alpinetest.NewKey("bench@vibedom-1.rsa.pub")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	rng := rand.New(rand.NewSource(1))
	lock := &alpine.Lock{Branch: alpine.Branch, Arch: "x86_64"}
	var files []string
	var total int64
	word := []byte("the quick brown fox jumps over the lazy dog 0123456789 ")
	for p := 0; p < 40; p++ {
		var fs []alpinetest.File
		fs = append(fs, alpinetest.File{Name: fmt.Sprintf("usr/lib/pkg%02d/", p), Type: '5'})
		for f := 0; f < 400; f++ {
			size := 2000 + rng.Intn(30000)
			if f%100 == 0 {
				size = 1 << 20 * (1 + rng.Intn(6))
			}
			body := make([]byte, size)
			for i := 0; i < size; i += len(word) {
				copy(body[i:], word)
			}
			rng.Read(body[:size/3]) // a third incompressible
			fs = append(fs, alpinetest.File{Name: fmt.Sprintf("usr/lib/pkg%02d/f%04d", p, f), Body: body})
			total += int64(size)
		}
		if p == 0 {
			fs = append(fs, alpinetest.File{Name: "etc/", Type: '5'}, alpinetest.File{Name: "etc/ssl/", Type: '5'},
				alpinetest.File{Name: "etc/ssl/certs/", Type: '5'},
				alpinetest.File{Name: "etc/ssl/certs/ca-certificates.crt", Body: []byte("-----BEGIN CERTIFICATE-----\n")})
		}
		apk, rec, err := alpinetest.BuildAPK(alpinetest.Spec{Name: fmt.Sprintf("pkg%02d", p), Version: "1.0-r0", Arch: "x86_64", Files: fs, Key: key})
		if err != nil {
			b.Fatal(err)
		}
		path := filepath.Join(dir, rec.File())
		if err := os.WriteFile(path, apk, 0o644); err != nil {
			b.Fatal(err)
		}
		files = append(files, path)
		lock.Packages = append(lock.Packages, alpine.LockedPackage{Name: rec.Name, Version: rec.Version, Arch: rec.Arch, Repo: "main", Checksum: rec.Checksum, Size: rec.Size})
	}
	b.ResetTimer()
	var took time.Duration
	for i := 0; i < b.N; i++ {
		out := filepath.Join(b.TempDir(), "root.ext4")
		start := time.Now()
		r, err := rootfs.Build(context.Background(), rootfs.Options{Arch: "x86_64", Lock: lock, Files: files, Keys: key.Ring, Out: out})
		if err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		if i == 0 {
			b.Logf("%d packages, %d MB of files, image %d MB", len(files), total>>20, r.Size>>20)
		}
	}
	b.ReportMetric(float64(total)/(1<<20)/took.Seconds()*float64(b.N), "MB/s")
	b.ReportMetric(took.Seconds()/float64(b.N), "s/build")
}
