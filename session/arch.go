package session

import (
	"runtime"

	"github.com/vibedom/vibedom/vm"
)

// HostArch is the guest architecture that runs natively on this host.
func HostArch() vm.Arch {
	if runtime.GOARCH == "arm64" {
		return vm.ArchARM64
	}
	return vm.ArchAMD64
}
