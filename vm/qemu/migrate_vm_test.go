package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/boot/vmtest"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/vm"
)

// TestMigrationBlockedVM is the evidence behind QEMU machines not being
// vm.StateSavers: with the workspace shared and mounted, QEMU refuses to
// save the machine (a migration to a file) on both shares. If it ever
// succeeds, this QEMU can save: revisit machine.go and docs/vm.md.
func TestMigrationBlockedVM(t *testing.T) {
	tests := []struct {
		share   vm.ShareFS
		fs      string
		blocker string // in QEMU's refusal
	}{
		{vm.ShareVirtiofs, proto.FSVirtiofs, "vhost-user-fs"},
		{vm.Share9P, proto.FS9P, "VirtFS"},
	}
	for _, tt := range tests {
		t.Run(string(tt.share), func(t *testing.T) {
			d := New(Options{CacheDir: os.TempDir(), ShareFS: string(tt.share)})
			if d.noShare != nil {
				t.Skipf("%s cannot run here: %v", tt.share, d.noShare)
			}
			g := vmtest.Boot(t, vmtest.Harness{Driver: d, Arch: vm.ArchAMD64, ShareFS: tt.fs}, map[string]string{"a.txt": "a"})
			if out, st := g.Sh(t, "cat /mnt/workspace/a.txt"); st.Code != 0 || out != "a" {
				t.Fatalf("workspace not mounted: %q, %v", out, st)
			}
			m := g.Machine.(*machine)
			if err := vm.Pause(t.Context(), m); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "state")
			_, err := m.qmp.execute(t.Context(), "migrate", map[string]any{"uri": "exec:cat > " + out})
			if err == nil {
				t.Fatalf("QEMU accepted a migration with a mounted %s share: it can save this machine", tt.share)
			}
			t.Logf("QEMU refuses: %v", err)
			if !strings.Contains(err.Error(), tt.blocker) {
				t.Errorf("refusal %q does not name %q", err, tt.blocker)
			}
		})
	}
}
