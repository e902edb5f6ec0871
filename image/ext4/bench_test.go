package ext4

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// treeFromDir mirrors a host directory as a tree (files opened lazily).
func treeFromDir(t testing.TB, dir string) *Node {
	t.Helper()
	var walk func(string) *Node
	walk = func(p string) *Node {
		ents, err := os.ReadDir(p)
		if err != nil {
			t.Fatal(err)
		}
		n := &Node{Type: TypeDir, Meta: Meta{Mode: 0o755}}
		for _, e := range ents {
			full := filepath.Join(p, e.Name())
			if e.IsDir() {
				n.Entries = append(n.Entries, Dirent{e.Name(), walk(full)})
				continue
			}
			fi, _ := e.Info()
			n.Entries = append(n.Entries, Dirent{e.Name(), &Node{Type: TypeFile, Size: fi.Size(), Meta: Meta{Mode: fi.Mode().Perm()},
				Open: func() (io.ReadCloser, error) { return os.Open(full) }}})
		}
		return n
	}
	return walk(dir)
}

// BenchmarkWriteVsMkfs writes the same ~256 MB tree (2,000 files) with
// Write and with `mkfs.ext4 -d` and reports the ratio.
func BenchmarkWriteVsMkfs(b *testing.B) {
	mkfs, err := exec.LookPath("/usr/sbin/mkfs.ext4")
	if err != nil {
		b.Skip("mkfs.ext4 not installed")
	}
	src := b.TempDir()
	var total int64
	for i := 0; i < 2000; i++ {
		d := filepath.Join(src, "d"+itoa(i%40))
		os.MkdirAll(d, 0o755)
		size := int64(4096 + (i%17)*16000)
		if i%250 == 0 {
			size = 20 << 20
		}
		f, _ := os.Create(filepath.Join(d, "f"+itoa(i)))
		io.Copy(f, &pattern{n: size})
		f.Close()
		total += size
	}
	out := b.TempDir()
	var ours, theirs time.Duration
	for i := 0; i < b.N; i++ {
		p := filepath.Join(out, "ours.ext4")
		os.Remove(p)
		f, _ := os.Create(p)
		start := time.Now()
		if _, err := Write(f, treeFromDir(b, src), Options{Label: "bench", Time: testTime, UUID: [16]byte{1}}); err != nil {
			b.Fatal(err)
		}
		f.Sync()
		f.Close()
		ours += time.Since(start)
		q := filepath.Join(out, "mkfs.ext4")
		os.Remove(q)
		start = time.Now()
		if o, err := exec.Command(mkfs, "-q", "-F", "-d", src, "-O", "^has_journal", q, "1200M").CombinedOutput(); err != nil {
			b.Fatalf("mkfs: %v %s", err, o)
		}
		if f, err := os.OpenFile(q, os.O_RDWR, 0); err == nil {
			f.Sync()
			f.Close()
		}
		theirs += time.Since(start)
	}
	mb := float64(total) / (1 << 20)
	b.ReportMetric(mb/ours.Seconds()*float64(b.N), "MB/s")
	b.ReportMetric(mb/theirs.Seconds()*float64(b.N), "mkfs-MB/s")
	b.ReportMetric(theirs.Seconds()/ours.Seconds(), "x-faster-than-mkfs")
}
