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

// TestCollectNotCarriedVM: what a patch cannot carry — a path past 4096
// bytes, a setuid bit, a sticky directory, a fifo — is listed as not
// carried with its reason, and the rest of the session is still collected
// and applied. (A path over 4096 bytes once aborted the whole collection.)
func TestCollectNotCarriedVM(t *testing.T) {
	requireVM(t)
	c := newCLI(t)
	ws := sampleWorkspace(t)
	script := `set -e
echo ok > ok.txt
printf '#!/bin/sh\n' > suid.sh
chmod 4755 suid.sh
mkdir shared
chmod 1777 shared
echo x > shared/f
mkfifo pipe
d=` + strings.Repeat("d", 180) + `
(i=0; while [ $i -lt 25 ]; do mkdir $d; cd -P $d; echo x > f; i=$((i+1)); done)`
	stdout, stderr, code := c.run(t, "", "run", ws, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if data, err := os.ReadFile(filepath.Join(ws, "ok.txt")); err != nil || string(data) != "ok\n" {
		t.Errorf("ok.txt on the host: %q, %v\n%s", data, err, stderr)
	}
	// The deep paths make the summary long: show its lines shortened.
	var short []string
	for _, l := range strings.Split(stderr, "\n") {
		if len(l) > 160 {
			l = l[:80] + " … " + l[len(l)-70:]
		}
		short = append(short, l)
	}
	for _, want := range []string{"Not carried", "suid.sh  setuid bit", "shared  sticky bit", "pipe  special file"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the summary does not say %q:\n%s", want, strings.Join(short, "\n"))
		}
	}
	if !strings.Contains(stderr, "longer than 4096 bytes") && !strings.Contains(stderr, "file name too long") {
		t.Errorf("the deep path is not reported as not carried:\n%s", strings.Join(short, "\n"))
	}
	c.assertNothingLeft(t)
}
