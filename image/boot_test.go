package image

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/image/initramfs"
	"github.com/vibedom/vibedom/vm"
)

// smokeInit replaces /init (through the appended session archive, as the
// kernel's override rules allow) with a script that exercises what the
// real guest agent will do with the image: load every module of the load
// list, mount the read-only 9p workspace, make and mount an ext4 scratch
// disk, mount the overlay, and look for the virtio-net and virtio-console
// devices. Each check prints "SMOKE ok …" or "SMOKE FAIL …".
const smokeInit = `#!/bin/busybox sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail=0
ok() { echo "SMOKE ok $*"; }
bad() { echo "SMOKE FAIL $*"; fail=1; }
check() { if "$@" >/dev/null 2>&1; then ok "$*"; else bad "$*"; fi; }
rel=$(uname -r)
# Each line is a module, then the modules it needs (listed before it).
while read -r m needs; do
	insmod "/lib/modules/$rel/$m" || echo "SMOKE insmod-failed $m"
done < /etc/vibedom/modules.load
echo "SMOKE modules loaded after $(cut -d' ' -f1 /proc/uptime)s"
check mount -t 9p -o trans=virtio,version=9p2000.L,ro workspace /mnt/workspace
check grep -q hello-from-host /mnt/workspace/hello.txt
if echo x > /mnt/workspace/new 2>/dev/null; then bad "workspace is writable"; else ok "workspace is read-only"; fi
mount -o remount,rw /mnt/workspace 2>/dev/null
if echo x > /mnt/workspace/new 2>/dev/null; then bad "workspace writable after remount"; else ok "workspace read-only after remount,rw"; fi
check mke2fs -F /dev/vda
check mount -t ext4 /dev/vda /mnt/scratch
check grep -q '^/dev/vda /mnt/scratch ext4 ' /proc/mounts
check mkdir -p /mnt/scratch/upper /mnt/scratch/overlay-work
check mount -t overlay overlay -o lowerdir=/mnt/workspace,upperdir=/mnt/scratch/upper,workdir=/mnt/scratch/overlay-work /work
check sh -c 'echo changed > /work/hello.txt'
check grep -q changed /mnt/scratch/upper/hello.txt
check rm /work/other.txt
check test -c /mnt/scratch/upper/other.txt
check grep -q '^name *: crc32c$' /proc/crypto
check test -d /sys/class/net/eth0
check ip link set eth0 up
check sh -c 'ls -d /sys/bus/virtio/drivers/virtio_console/virtio*'
check sh -c 'ls -d /sys/bus/virtio/drivers/virtio_blk/virtio*'
check test -d /sys/module/vmw_vsock_virtio_transport -o -d /sys/bus/virtio/drivers/vmw_vsock_virtio_transport
check grep -qw virtiofs /proc/filesystems
check test -f /vibedom/boot.json
check test "$(stat -c %a /vibedom/ssh_host_ed25519_key)" = 600
check test "$(stat -c %a /tmp)" = 1777
check test -L /usr/bin/vibedom-guest -o -f /usr/bin/vibedom-guest
echo "SMOKE crc32c modules: $(grep -o '^crc32c[a-z_]*' /proc/modules | tr '\n' ' ')"
echo "SMOKE crc32c drivers: $(grep -A1 '^name *: crc32c$' /proc/crypto | grep driver | tr -s ' ' | tr '\n' ' ')"
echo "SMOKE done after $(cut -d' ' -f1 /proc/uptime)s"
sync
umount /work /mnt/scratch /mnt/workspace
if [ $fail = 0 ]; then echo VIBEDOM-SMOKE-OK; fi
poweroff -f
`

// qemuSmoke is the QEMU command line of a smoke boot for one arch.
type qemuSmoke struct {
	binary  string
	args    []string
	console string
	// mayFail lists modules allowed to fail insmod: the accelerated
	// variants that probe the CPU (TCG's default CPU lacks SSE4.2).
	mayFail []string
}

var smokeMachines = map[vm.Arch]qemuSmoke{
	vm.ArchAMD64: {
		binary:  "qemu-system-x86_64",
		args:    []string{"-M", "q35", "-accel", "tcg"},
		console: "ttyS0",
		mayFail: []string{"crc32c-intel.ko"},
	},
	vm.ArchARM64: {
		binary:  "qemu-system-aarch64",
		args:    []string{"-M", "virt", "-cpu", "max", "-accel", "tcg"},
		console: "ttyAMA0",
	},
}

// TestSmokeBootVM boots the test image under QEMU (TCG) with a shell /init and
// checks that the module set gives the guest everything it needs.
func TestSmokeBootVM(t *testing.T) {
	t.Parallel()
	for _, arch := range []vm.Arch{vm.ArchAMD64, vm.ArchARM64} {
		t.Run(string(arch), func(t *testing.T) {
			mach := smokeMachines[arch]
			qemu, err := exec.LookPath(mach.binary)
			if err != nil {
				t.Skipf("%s not installed (apt-get install qemu-system-x86 qemu-system-arm)", mach.binary)
			}
			if arch == vm.ArchARM64 && testing.Short() {
				t.Skip("arm64 boot under emulation skipped in -short mode")
			}
			base := sharedImage(t, arch)
			dir := t.TempDir()
			ws := filepath.Join(dir, "workspace")
			os.MkdirAll(ws, 0o755)
			os.WriteFile(filepath.Join(ws, "hello.txt"), []byte("hello-from-host\n"), 0o644)
			os.WriteFile(filepath.Join(ws, "other.txt"), []byte("to be deleted in the overlay\n"), 0o644)
			before := treeDigest(t, ws)
			disk := filepath.Join(dir, "disk.raw")
			if err := os.WriteFile(disk, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(disk, 64<<20); err != nil {
				t.Fatal(err)
			}

			files, err := SessionFiles(testBootConfig(), fakeHostKey(), nil)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, initramfs.File{Path: "/init", Mode: 0o755, Data: []byte(smokeInit)})
			initrd := filepath.Join(dir, "initrd")
			hostStart := time.Now()
			if err := WriteSessionInitrd(initrd, base, files); err != nil {
				t.Fatal(err)
			}
			hostTook := time.Since(hostStart)

			logPath := filepath.Join(dir, "console.log")
			timerCheck := "" // see vm/qemu: the IO-APIC timer check can miss its window under load
			if arch == vm.ArchAMD64 {
				timerCheck = "no_timer_check "
			}
			args := append(append([]string(nil), mach.args...),
				"-m", "512", "-smp", "1",
				"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
				"-serial", "file:"+logPath,
				"-kernel", base.Kernel, "-initrd", initrd,
				"-append", "console="+mach.console+" panic=-1 "+timerCheck+"quiet loglevel=4",
				"-virtfs", "local,path="+ws+",mount_tag=workspace,security_model=none,readonly=on",
				"-drive", "file="+disk+",format=raw,if=none,id=d0",
				"-device", "virtio-blk-pci,drive=d0",
				"-device", "virtio-serial-pci",
				"-netdev", "user,id=n0,restrict=on",
				"-device", "virtio-net-pci,netdev=n0",
			)
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, qemu, args...)
			cmd.WaitDelay = 5 * time.Second
			start := time.Now()
			out, err := cmd.CombinedOutput()
			took := time.Since(start)
			console, _ := os.ReadFile(logPath)
			if err != nil {
				t.Fatalf("%s: %v\n%s\nconsole:\n%s", mach.binary, err, out, console)
			}
			var failed []string
			for _, line := range strings.Split(string(console), "\n") {
				// Kernel messages may share a line with the script's output.
				i := strings.Index(line, "SMOKE ")
				if i < 0 {
					continue
				}
				line = strings.TrimSpace(line[i:])
				switch {
				case strings.HasPrefix(line, "SMOKE FAIL"):
					failed = append(failed, line)
				case strings.HasPrefix(line, "SMOKE insmod-failed "):
					m := strings.TrimPrefix(line, "SMOKE insmod-failed ")
					allowed := false
					for _, ok := range mach.mayFail {
						allowed = allowed || strings.HasSuffix(m, "/"+ok)
					}
					if !allowed {
						failed = append(failed, line)
					} else {
						t.Logf("%s (allowed: probes for a CPU feature)", line)
					}
				case strings.HasPrefix(line, "SMOKE "):
					t.Log(line)
				}
			}
			if len(failed) > 0 || !strings.Contains(string(console), "VIBEDOM-SMOKE-OK") {
				t.Errorf("smoke boot failed: %v\nconsole:\n%s", failed, console)
			}
			if after := treeDigest(t, ws); after != before {
				t.Errorf("the host workspace changed during the boot")
			}
			t.Logf("%s: session initrd written in %v; QEMU ran %v (TCG, boot to poweroff)", arch, hostTook, took)
		})
	}
}

// treeDigest hashes the names, modes and contents of a directory tree.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b.WriteString(rel + " " + fi.Mode().String() + "\n")
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b.WriteString(hexSum(string(data)) + "\n")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hexSum(b.String())
}
