package guest

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/guest/proto"
)

// module is one line of proto.ModuleListPath: a module file relative to
// /lib/modules/<release>, and the files it needs loaded first.
type module struct {
	rel  string
	deps []string
}

// name is the module's kernel name: virtio_pci for
// kernel/drivers/virtio/virtio_pci.ko.
func (m module) name() string {
	return moduleName(m.rel)
}

func moduleName(rel string) string {
	return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(rel), ".ko"), "-", "_")
}

// parseModuleList reads proto.ModuleListPath: one module a line, every
// module after those it needs, each line "REL [DEP_REL …]". Blank lines
// and # comments are skipped.
func parseModuleList(r io.Reader) ([]module, error) {
	var out []module
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		out = append(out, module{rel: f[0], deps: f[1:]})
	}
	return out, sc.Err()
}

// laterModules are loaded once the agent runs: virtio MMIO, for devices a
// platform may put there.
var laterModules = []string{"virtio_mmio"}

// neededModules names the modules this boot uses before the agent serves:
// the disks, the filesystems, the workspace share, the control channel and
// the network as the boot data configures them. Names the kernel has built
// in are simply not in the list.
func neededModules(bc *proto.BootConfig) []string {
	// The power button (ACPI on x86, GPIO keys on arm64 virt) and its
	// event device come first too: a press before its driver is bound is
	// lost, and a host may stop the guest right after it is ready.
	// So does the memory balloon: an idle guest hands freed pages back
	// through it from the start.
	n := []string{"virtio_pci", "virtio_blk", "ext4", "overlay", "button", "gpio_keys", "evdev", "virtio_balloon"}
	switch bc.Control.Transport {
	case proto.TransportVsock:
		n = append(n, "vsock", "vmw_vsock_virtio_transport")
	default:
		n = append(n, "virtio_console")
	}
	switch bc.Workspace.FSType {
	case proto.FS9P:
		n = append(n, "9p", "9pnet_virtio")
	case proto.FSVirtiofs:
		n = append(n, "virtiofs")
	}
	if bc.Network != nil {
		n = append(n, "virtio_net", "af_packet")
	}
	return n
}

// splitModules returns the modules of list that the named ones need (they
// and what they depend on, transitively), then those laterModules need
// besides, each in list order. Modules neither needs (the transports and
// filesystems this VM does not use) are in neither. A list without
// dependencies (written before they were recorded) is needed whole.
func splitModules(list []module, names []string) (now, later []module) {
	hasDeps := false
	byRel := map[string]module{}
	for _, m := range list {
		byRel[m.rel] = m
		hasDeps = hasDeps || len(m.deps) > 0
	}
	if !hasDeps {
		return list, nil
	}
	closure := func(names []string, skip map[string]bool) map[string]bool {
		want := map[string]bool{}
		for _, n := range names {
			want[n] = true
		}
		need := map[string]bool{}
		var mark func(rel string)
		mark = func(rel string) {
			if need[rel] || skip[rel] {
				return
			}
			need[rel] = true
			for _, d := range byRel[rel].deps {
				mark(d)
			}
		}
		for _, m := range list {
			if want[m.name()] {
				mark(m.rel)
			}
		}
		return need
	}
	first := closure(names, nil)
	second := closure(laterModules, first)
	for _, m := range list {
		switch {
		case first[m.rel]:
			now = append(now, m)
		case second[m.rel]:
			later = append(later, m)
		}
	}
	return now, later
}

// loadModules loads the modules the named ones need and returns the rest of
// the image's list for loadLater. Failures do not stop the others: some
// modules are optional on some CPUs (the accelerated crc32c needs SSE 4.2,
// which an emulated CPU may lack), and a missing one that matters shows up
// as a clear mount or device error later.
//
// Modules load one after the other, in the list's order: loaded side by
// side, each waited for the others (the kernel serialises much of a load)
// and the set took three to six times longer under emulation.
func loadModules(log *slog.Logger, names []string) (later []module) {
	f, err := os.Open(proto.ModuleListPath)
	if err != nil {
		log.Debug("no kernel module list", "err", err)
		return nil
	}
	list, err := parseModuleList(f)
	f.Close()
	if err != nil {
		log.Warn("read the kernel module list", "err", err)
	}
	now, later := splitModules(list, names)
	loadAll(log, now)
	return later
}

// loadLater loads the modules setup left for after the agent started, at
// the lowest CPU priority: under emulation the VM's CPUs are scarce, and
// the agent's start and the SSH handshake come first.
func loadLater(log *slog.Logger, later []module) {
	if len(later) == 0 {
		return
	}
	// A module's loading and init run in the calling thread: lower only
	// this one, and never hand it back to other goroutines.
	runtime.LockOSThread()
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
	t := time.Now()
	loadAll(log, later)
	log.Debug("later kernel modules loaded", "count", len(later), "took", time.Since(t).Round(time.Millisecond))
}

// loadAll loads list in order.
func loadAll(log *slog.Logger, list []module) {
	if len(list) == 0 {
		return
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	dir := filepath.Join("/lib/modules", unix.ByteSliceToString(uts.Release[:]))
	var failed []string
	for _, m := range list {
		if err := loadModule(filepath.Join(dir, filepath.Clean("/"+m.rel))); err != nil {
			failed = append(failed, m.name()+" ("+errText(err)+")")
		}
	}
	if len(failed) > 0 {
		log.Info("some kernel modules did not load", "modules", strings.Join(failed, ", "))
	}
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if err == nil || errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}
