//go:build linux

package session

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/pkg/sftp"

	"github.com/vibedom/vibedom/boot/vmtest"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/qemu"
)

// BenchmarkCollectVM measures collecting an npm-install-like tree (50,000
// small files in 500 packages) from a real guest, the old way (the change
// set as JSON, then one SFTP open/read/close per file) against the
// collection stream, in the same VM and the same run, and reports the
// ratio. Both build the patch with the same builder (to io.Discard).
//
//	go test ./session -run '^$' -bench CollectVM -benchtime 1x -timeout 30m
func BenchmarkCollectVM(b *testing.B) {
	g := vmtest.Boot(b, vmtest.Harness{
		Driver: qemu.New(qemu.Options{CacheDir: os.TempDir(), ShareFS: string(vm.Share9P)}), Arch: vm.ArchAMD64,
		Transport: proto.TransportVirtioSerial, ShareFS: proto.FS9P,
		BootTimeout: 5 * time.Minute, ScratchSize: 4 << 30, // 65,536 inodes
	}, map[string]string{"package.json": "{}\n"})
	const pkgs, perPkg = 500, 100
	// busybox has no split; awk writes the files without a fork each.
	script := fmt.Sprintf(`set -e
mkdir -p /work/node_modules && cd /work/node_modules
seq 0 %[1]d | sed 's/^/p/' | xargs mkdir
awk 'BEGIN { for (i = 0; i < %[2]d; i++) for (j = 0; j < %[3]d; j++) {
	f = "p" i "/f" j ".js"
	printf "/* package %%d file %%d */\nmodule.exports = function f%%d(a, b) { return [a, b, %%d].join(\"-\"); };\n// %%s\n", i, j, j, i * j, "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua" > f
	close(f)
} }'
find /work/node_modules -type f | wc -l`, pkgs-1, pkgs, perPkg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	st, err := g.Client.Exec(ctx, script, guestlink.ExecOptions{Stdout: &out, Stderr: &errb})
	if err != nil || !st.Success() || strings.TrimSpace(out.String()) != fmt.Sprint(pkgs*perPkg) {
		b.Fatalf("make the tree: %v %v %q %q", st, err, out.String(), errb.String())
	}
	want := pkgs * perPkg
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		n, err := collectOld(ctx, g.Client)
		old := time.Since(t0)
		if err != nil || n != want {
			b.Fatalf("old path: %d files, %v", n, err)
		}
		t1 := time.Now()
		n, err = collectNew(ctx, g.Client)
		nw := time.Since(t1)
		if err != nil || n != want {
			b.Fatalf("stream: %d files, %v", n, err)
		}
		b.ReportMetric(float64(want)/old.Seconds(), "old-files/s")
		b.ReportMetric(float64(want)/nw.Seconds(), "stream-files/s")
		b.ReportMetric(old.Seconds()/nw.Seconds(), "ratio")
		b.Logf("%d files: old path %.1fs (%.0f files/s), stream %.1fs (%.0f files/s): %.1f× faster",
			want, old.Seconds(), float64(want)/old.Seconds(), nw.Seconds(), float64(want)/nw.Seconds(), old.Seconds()/nw.Seconds())
	}
}

// countingBuild builds the patch against an empty baseline and counts the
// files it carries.
func countingBuild(ctx context.Context, n *int) func(*overlay.ChangeSet, overlay.Source) error {
	return func(cs *overlay.ChangeSet, src overlay.Source) error {
		info, err := overlay.BuildPatch(ctx, cs, src, emptyTree{}, io.Discard, overlay.BuildOptions{})
		if err == nil {
			*n = len(info.Files)
		}
		return err
	}
}

func collectNew(ctx context.Context, c *guestlink.Client) (int, error) {
	var n int
	err := collect(ctx, c, collectLimits{MaxFile: maxCollectFile, MaxTotal: 4 << 30}, countingBuild(ctx, &n))
	return n, err
}

// collectOld is how sessions collected before the stream: the change set
// from proto.ChangesCommand, then each file over SFTP.
func collectOld(ctx context.Context, c *guestlink.Client) (int, error) {
	var out bytes.Buffer
	st, err := c.Exec(ctx, proto.ChangesCommand, guestlink.ExecOptions{Stdout: &limitedBuffer{buf: &out, max: maxChangeSet}})
	if err != nil || !st.Success() {
		return 0, fmt.Errorf("changes: %v %v", st, err)
	}
	cs, err := overlay.ParseChangeSet(out.Bytes())
	if err != nil {
		return 0, err
	}
	sc, err := c.SFTP()
	if err != nil {
		return 0, err
	}
	defer sc.Close()
	var n int
	err = countingBuild(ctx, &n)(cs, sftpSource{sc})
	return n, err
}

// sftpSource reads the agent's files from the guest's /work over SFTP.
type sftpSource struct{ c *sftp.Client }

func (s sftpSource) Open(p string) (io.ReadCloser, error) {
	if err := overlay.ValidatePath(p); err != nil {
		return nil, err
	}
	return s.c.Open(path.Join(proto.WorkDir, p))
}
