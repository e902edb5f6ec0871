package image

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/image/kernel"
	"github.com/vibedom/vibedom/vm"
)

// A folder handed to the guest image as vibedom's guest kernel that offers
// loadable modules (here: Debian's modular kernel) is refused: its modules
// would be packed without being among the recipe's inputs.
func TestGuestKernelWithModulesRefused(t *testing.T) {
	t.Parallel()
	kdir, _, err := locateDistroKernel(vm.ArchAMD64)
	if err != nil {
		t.Skipf("no Debian kernel assets: %v", err)
	}
	_, _, err = writeGuestKernel(t.TempDir(), kdir, vm.ArchAMD64, kernel.GuestModules)
	if err == nil || !strings.Contains(err.Error(), "has loadable modules") {
		t.Fatalf("writeGuestKernel on a modular kernel: %v", err)
	}
}

// locateDistroKernel is the Debian kernel folder beside the assets'
// busybox, whichever kernel the assets would boot.
func locateDistroKernel(arch vm.Arch) (string, string, error) {
	a := os.Getenv("VIBEDOM_ASSETS")
	if a == "" {
		wd, _ := os.Getwd()
		for d := wd; ; d = filepath.Dir(d) {
			if fi, err := os.Stat(filepath.Join(d, ".cache", "assets", string(arch), "kernel")); err == nil && fi.IsDir() {
				a = filepath.Join(d, ".cache", "assets")
				break
			}
			if filepath.Dir(d) == d {
				return "", "", os.ErrNotExist
			}
		}
	}
	k := filepath.Join(a, string(arch), "kernel")
	_, rel, err := kernel.Find(k)
	return k, rel, err
}
