package vz

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/vm"
)

// limits are the host's bounds on a machine's size, as Virtualization.framework
// reports them.
type limits struct {
	minCPUs, maxCPUs uint
	minMem, maxMem   uint64 // bytes
}

// plan is a vm.Config checked and turned into the values the vz calls take.
type plan struct {
	name        string
	kernel      string
	initrd      string
	cmdline     string
	cpus        uint
	memBytes    uint64
	shares      []vm.Share
	disks       []vm.Disk
	consoleLog  string // empty: console output is discarded
	network     *vm.Network
	mac         net.HardwareAddr // nil: a random locally administered address
	controlPort uint32
	machineID   []byte // empty: the framework makes a new identity
}

// maxCmdline is the arm64 kernel's COMMAND_LINE_SIZE less its final NUL.
const maxCmdline = 2047

// hvcConsole is the console argument for the virtio console vz provides.
const hvcConsole = "console=hvc0"

// invalid wraps a message in vm.ErrInvalidConfig.
func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", vm.ErrInvalidConfig, fmt.Sprintf(format, a...))
}

// newPlan validates cfg for this backend and host and returns what Start
// hands to vz. Errors wrap vm.ErrInvalidConfig, except an architecture the
// host cannot run, which wraps vm.ErrUnavailable.
func newPlan(cfg vm.Config, lim limits) (plan, error) {
	if err := cfg.Validate(); err != nil {
		return plan{}, err
	}
	if err := checkArch(cfg.Arch); err != nil {
		return plan{}, err
	}
	if cfg.CPUs < 0 || uint(cfg.CPUs) < lim.minCPUs || uint(cfg.CPUs) > lim.maxCPUs {
		return plan{}, invalid("cpus must be between %d and %d on this Mac, got %d", lim.minCPUs, lim.maxCPUs, cfg.CPUs)
	}
	mem := uint64(cfg.MemoryMiB) << 20
	if mem < lim.minMem || mem > lim.maxMem {
		return plan{}, invalid("memory must be between %d MiB and %d MiB on this Mac, got %d MiB", lim.minMem>>20, lim.maxMem>>20, cfg.MemoryMiB)
	}
	if err := checkKernelFile(cfg.Kernel); err != nil {
		return plan{}, err
	}
	cmdline, err := kernelCmdline(cfg.Cmdline)
	if err != nil {
		return plan{}, err
	}
	if cfg.ConsoleLog != "" {
		if fi, err := os.Stat(filepath.Dir(cfg.ConsoleLog)); err != nil || !fi.IsDir() {
			return plan{}, invalid("console log %s: its directory does not exist", cfg.ConsoleLog)
		}
	}
	p := plan{
		name:        cfg.Name,
		kernel:      cfg.Kernel,
		initrd:      cfg.Initrd,
		cmdline:     cmdline,
		cpus:        uint(cfg.CPUs),
		memBytes:    mem,
		shares:      cfg.Shares,
		disks:       cfg.Disks,
		consoleLog:  cfg.ConsoleLog,
		network:     cfg.Network,
		controlPort: cfg.ControlPort,
		machineID:   bytes.Clone(cfg.MachineID),
	}
	if err := checkMachineIDSize(p.machineID); err != nil {
		return plan{}, err
	}
	if p.controlPort == 0 {
		p.controlPort = vm.DefaultControlPort
	}
	if cfg.Network != nil {
		if p.mac, err = parseMAC(cfg.Network.MAC); err != nil {
			return plan{}, err
		}
	}
	return p, nil
}

// checkArch reports whether this backend runs guests of arch: on Apple
// silicon, Virtualization.framework runs arm64 guests only.
func checkArch(arch vm.Arch) error {
	if arch != vm.ArchARM64 {
		return fmt.Errorf("%w: vz runs only arm64 guests on Apple silicon, not %q: use an arm64 image", vm.ErrUnavailable, arch)
	}
	return nil
}

// kernelCmdline returns the kernel command line: the caller's arguments with
// console=hvc0 appended unless already present, so /dev/console is the
// virtio console whose output reaches ConsoleLog.
func kernelCmdline(extra string) (string, error) {
	if strings.ContainsAny(extra, "\x00\n\r") {
		return "", invalid("kernel command line holds a NUL or line break")
	}
	fields := strings.Fields(extra)
	has := false
	for _, f := range fields {
		if f == hvcConsole {
			has = true
		}
	}
	if !has {
		fields = append(fields, hvcConsole)
	}
	line := strings.Join(fields, " ")
	if len(line) > maxCmdline {
		return "", invalid("kernel command line is %d bytes, the arm64 kernel takes at most %d", len(line), maxCmdline)
	}
	return line, nil
}

// parseMAC parses a NIC address. Empty means "choose one" and returns nil.
// The address must be a 6-byte unicast address other than all zeros.
func parseMAC(s string) (net.HardwareAddr, error) {
	if s == "" {
		return nil, nil
	}
	mac, err := net.ParseMAC(s)
	if err != nil {
		return nil, invalid("network MAC %q: %v", s, err)
	}
	if len(mac) != 6 {
		return nil, invalid("network MAC %q: want a 6-byte Ethernet address", s)
	}
	if mac[0]&1 != 0 {
		return nil, invalid("network MAC %q is a multicast address; use a unicast one such as 52:54:00:12:34:56", s)
	}
	if bytes.Equal(mac, make(net.HardwareAddr, 6)) {
		return nil, invalid("network MAC %q is all zeros", s)
	}
	return mac, nil
}

// Offsets and magic numbers of the arm64 Linux Image header
// (Documentation/arch/arm64/booting.rst) and of compressed files.
const (
	arm64MagicOffset = 56
	arm64Magic       = 0x644d5241 // "ARM\x64", little-endian
	zbootTypeOffset  = 24         // EFI zboot: compression name, NUL-padded
	kernelHeaderLen  = 64
)

// compressions maps the leading bytes of a compressed file to its format.
var compressions = []struct {
	magic []byte
	name  string
	cmd   string // how to unpack it
}{
	{[]byte{0x1f, 0x8b}, "gzip", "gunzip -c KERNEL > Image"},
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, "zstd", "zstd -dc KERNEL > Image"},
	{[]byte{0xfd, '7', 'z', 'X', 'Z', 0x00}, "xz", "xz -dc KERNEL > Image"},
	{[]byte{'B', 'Z', 'h'}, "bzip2", "bunzip2 -c KERNEL > Image"},
	{[]byte{0x04, 0x22, 0x4d, 0x18}, "lz4", "lz4 -dc KERNEL > Image"},
	{[]byte{0x02, 0x21, 0x4c, 0x18}, "lz4 (legacy)", "lz4 -dc KERNEL > Image"},
	{[]byte{0x89, 'L', 'Z', 'O'}, "lzo", "lzop -dc KERNEL > Image"},
}

// checkKernelFile reports whether path holds an uncompressed arm64 Image.
func checkKernelFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return invalid("kernel: %v", err)
	}
	defer f.Close()
	head := make([]byte, kernelHeaderLen)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return invalid("kernel %s: %v", path, err)
	}
	return checkKernelHeader(path, head[:n])
}

// checkKernelHeader reports whether head, the first bytes of the kernel file
// at path, starts an uncompressed arm64 Image. The error says how to get
// one when the kernel is compressed.
func checkKernelHeader(path string, head []byte) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %w: %s", vm.ErrInvalidConfig, ErrKernelFormat, fmt.Sprintf(format, a...))
	}
	for _, c := range compressions {
		if bytes.HasPrefix(head, c.magic) {
			return bad("kernel %s is %s-compressed; Virtualization.framework boots only an uncompressed arm64 Image: unpack it first (%s)",
				path, c.name, strings.ReplaceAll(c.cmd, "KERNEL", strconv.Quote(path)))
		}
	}
	if len(head) >= zbootTypeOffset+8 && bytes.HasPrefix(head, []byte("MZ")) && string(head[4:8]) == "zimg" {
		kind := strings.TrimRight(string(head[zbootTypeOffset:zbootTypeOffset+8]), "\x00")
		return bad("kernel %s is an EFI zboot image (%s-compressed payload); Virtualization.framework boots only an uncompressed arm64 Image: use the kernel build's arch/arm64/boot/Image",
			path, kind)
	}
	if len(head) < kernelHeaderLen {
		return bad("kernel %s is %d bytes, too short for an arm64 Image header", path, len(head))
	}
	if binary.LittleEndian.Uint32(head[arm64MagicOffset:]) != arm64Magic {
		return bad("kernel %s has no arm64 Image magic (is it an x86 kernel, or an ELF vmlinux?); use an arm64 kernel's uncompressed Image", path)
	}
	return nil
}

// parseMacOSVersion returns the major and minor numbers of a macOS product
// version such as "14.4.1".
func parseMacOSVersion(s string) (major, minor int, err error) {
	parts := strings.SplitN(strings.TrimSpace(s), ".", 3)
	major, err = strconv.Atoi(parts[0])
	if err != nil || major <= 0 {
		return 0, 0, fmt.Errorf("parse macOS version %q: not a version number", s)
	}
	if len(parts) > 1 {
		if minor, err = strconv.Atoi(parts[1]); err != nil || minor < 0 {
			return 0, 0, fmt.Errorf("parse macOS version %q: not a version number", s)
		}
	}
	return major, minor, nil
}

// minMacOS is the oldest macOS the backend runs on. Virtiofs and a forced
// stop need 12; Alpine 3.17+ kernels need 13.3, Linux 6.2+ guests needed the
// framework's fixes in 13.5, and saving a paused machine to disk needs 14.
const minMacOS = 14

// checkMacOSVersion turns the product version into ErrUnavailable when it
// is too old.
func checkMacOSVersion(product string) error {
	major, _, err := parseMacOSVersion(product)
	if err != nil {
		return fmt.Errorf("%w: %v", vm.ErrUnavailable, err)
	}
	if major < minMacOS {
		return fmt.Errorf("%w: vz needs macOS %d or later, this Mac runs %s: update macOS or use the QEMU backend", vm.ErrUnavailable, minMacOS, product)
	}
	return nil
}

// entitlement is the code-signing entitlement Virtualization.framework
// requires of the process.
const entitlement = "com.apple.security.virtualization"

// classifyValidateError explains a configuration the framework refused. A
// missing entitlement is a property of the binary, not of the config, so it
// wraps vm.ErrUnavailable and says how to sign; anything else wraps
// vm.ErrInvalidConfig.
func classifyValidateError(err error) error {
	if strings.Contains(err.Error(), entitlement) {
		return fmt.Errorf("%w: this binary lacks the %s entitlement: sign it with `codesign --entitlements entitlements.plist -s - BINARY` (make build does): %v",
			vm.ErrUnavailable, entitlement, err)
	}
	return fmt.Errorf("%w: Virtualization.framework refused the configuration: %v", vm.ErrInvalidConfig, err)
}

// minBalloonMiB is the smallest memory target the balloon is set to: the
// smallest machine vm.Config allows.
const minBalloonMiB = 128

// balloonTarget is the balloon target in bytes for a wish of mib MiB:
// whole MiB, at least minBalloonMiB and at most the machine's memory.
func (p plan) balloonTarget(mib int) uint64 {
	most := int(p.memBytes >> 20)
	return uint64(min(max(mib, minBalloonMiB), most)) << 20
}
