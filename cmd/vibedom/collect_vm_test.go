package main

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCollectLargeFilesVM: files of 2 MB, 100 MB and 200 MB written in the
// guest come back whole: `vibedom run --apply` leaves them in the host
// workspace with the hashes the guest computed. (Collection once went
// through SFTP, whose short reads cut every file over ~1.1 MB.) The big
// files repeat an 8 KiB random block with a counter mixed in, so the patch
// compresses and the test stays short under TCG; the 2 MB file is random.
func TestCollectLargeFilesVM(t *testing.T) {
	requireVM(t)
	c := newCLI(t)
	ws := sampleWorkspace(t)
	script := `set -e
s=/mnt/scratch
dd if=/dev/urandom of=$s/p bs=1k count=8 2>/dev/null
i=0
while [ $i -lt 15 ]; do cat $s/p $s/p > $s/q; echo $i >> $s/q; mv $s/q $s/p; i=$((i+1)); done
head -c 209715211 $s/p > big200.bin
tail -c 104857613 $s/p > big100.bin
rm $s/p
dd if=/dev/urandom of=rand2.bin bs=1k count=2051 2>/dev/null
sha256sum big200.bin big100.bin rand2.bin`
	stdout, stderr, code := c.run(t, "", "run", ws, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			want[f[1]] = f[0]
		}
	}
	if len(want) != 3 {
		t.Fatalf("guest hashes: %q", stdout)
	}
	for name, sum := range want {
		f, err := os.Open(filepath.Join(ws, name))
		if err != nil {
			t.Errorf("%s not applied: %v\n%s", name, err, stderr)
			continue
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != sum {
			t.Errorf("%s: %d bytes on the host with sha256 %s, the guest had %s", name, n, got[:12], sum[:12])
		}
	}
	c.assertNothingLeft(t)
}
