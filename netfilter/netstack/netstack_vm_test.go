package netstack

import (
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"

	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestStackLinuxGuestVM boots a throwaway busybox initramfs under QEMU (TCG)
// with its one NIC on a Stack, and runs the guest side of the egress
// checks as root in it: DHCP with udhcpc, DNS with nslookup, HTTP with
// nc (direct and through the explicit proxy), ping, UDP to an outside
// resolver, and the same again after root rewrites its routes and
// resolv.conf. One boot, about ten seconds.
func TestStackLinuxGuestVM(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("boots a VM; skipped with -short")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (make setup)")
	}
	kernelDir, busybox, ok := findTestAssets()
	if !ok {
		t.Skip("test kernel and busybox missing (make assets)")
	}
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := buildNetInitrd(initrd, kernelDir, busybox); err != nil {
		t.Fatal(err)
	}
	kernels, _ := filepath.Glob(filepath.Join(kernelDir, "boot", "vmlinuz-*"))

	eng := &nsHTTPEngine{got: make(chan nsAccepted, 64)}
	events := &stacktest.Events{}
	res := &stacktest.Resolver{Known: map[string]bool{"api.example.com": true, "www.example.com": true}}
	pol := stacktest.Policy{"api.example.com": {80}, "www.example.com": {80}}
	guestMAC := net.HardwareAddr{0x02, 0x76, 0x64, 0, 0, 0x02}
	s, err := NewStack(StackConfig{Resolver: res, GuestMAC: guestMAC}, eng, pol, events, nil)
	if err != nil {
		t.Fatal(err)
	}
	host, vmEnd, err := SocketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, host) }()

	var console bytes.Buffer
	cmd := exec.CommandContext(ctx, qemu,
		"-machine", "q35", "-accel", "tcg", "-m", "256", "-smp", "1",
		"-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
		"-kernel", kernels[0], "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 no_timer_check quiet",
		"-netdev", "dgram,id=n0,local.type=fd,local.str=3",
		"-device", "virtio-net-pci,netdev=n0,mac="+guestMAC.String(),
	)
	cmd.ExtraFiles = []*os.File{vmEnd} // fd 3
	cmd.Stdout, cmd.Stderr = &console, &console
	runErr := cmd.Run()
	vmEnd.Close()
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	out := console.String()
	if runErr != nil && !strings.Contains(out, "RESULT done") {
		t.Fatalf("qemu: %v\n%s", runErr, out)
	}
	t.Logf("guest console:\n%s", out)

	results := map[string]string{}
	for _, m := range regexp.MustCompile(`RESULT (\S+) (\S+)`).FindAllStringSubmatch(out, -1) {
		results[m[1]] = m[2]
	}
	tests := []struct {
		step, want string // want "0" success, "fail" any non-zero status
	}{
		{"dhcp", "0"},
		{"address", "0"},
		{"route", "0"},
		{"resolv", "0"},
		{"ping-gateway", "fail"}, // ICMP goes nowhere, the gateway included
		{"nslookup-allowed", "0"},
		{"nslookup-denied", "fail"},
		{"http-allowed", "0"},
		{"http-denied-port", "fail"},
		{"http-ip", "fail"},
		{"http-gateway", "fail"},
		{"http-host-loopback", "fail"},
		{"ping-outside", "fail"},
		{"udp-outside-resolver", "fail"},
		{"http-proxy", "0"},
		{"tampered-nslookup-outside", "fail"},
		{"tampered-http-ip", "fail"},
		{"tampered-http-allowed", "0"},
	}
	for _, tt := range tests {
		t.Run(tt.step, func(t *testing.T) {
			got, ok := results[tt.step]
			switch {
			case !ok:
				t.Fatalf("step did not run")
			case tt.want == "0" && got != "0", tt.want == "fail" && got == "0":
				t.Errorf("exit status: got %s, want %s", got, tt.want)
			}
		})
	}
	t.Run("engine saw the allowed names", func(t *testing.T) {
		var direct, proxied int
		for len(eng.got) > 0 {
			a := <-eng.got
			if a.proxy {
				proxied++
				continue
			}
			if a.target.Name != "api.example.com" || a.target.Port != 80 {
				t.Errorf("engine was handed %+v", a.target)
			}
			direct++
		}
		if direct < 2 || proxied < 1 {
			t.Errorf("engine connections: %d direct, %d proxied; want at least 2 and 1", direct, proxied)
		}
	})
	t.Run("refusals were logged", func(t *testing.T) {
		for _, want := range []struct{ kind, what string }{
			{"dns", "evil.example.net"},
			{"connect", "93.184.216.34:80"},
			{"connect", "10.254.254.1:80"},
			{"icmp", "8.8.8.8"},
			{"icmp", "10.254.254.1"},
			{"udp", "8.8.8.8:53"},
		} {
			found := false
			for _, e := range events.All() {
				if e.Kind == want.kind && e.Decision == "deny" && (e.Name == want.what || e.Dst == want.what) {
					found = true
				}
			}
			if !found {
				t.Errorf("no %s deny event for %s", want.kind, want.what)
			}
		}
	})
	if st := s.Stats(); st.Spoofed != 0 || st.Malformed != 0 {
		t.Errorf("a real guest's frames were dropped as spoofed or malformed: %+v", st)
	}
}

// nsHTTPEngine answers every admitted connection with a tiny HTTP response
// (what an upstream would say through the MITM engine).
type nsHTTPEngine struct{ got chan nsAccepted }

func (e *nsHTTPEngine) HandleConn(ctx context.Context, c net.Conn, t Target) {
	e.got <- nsAccepted{target: t}
	e.reply(c, "hello from "+t.Name)
}

func (e *nsHTTPEngine) HandleProxyConn(ctx context.Context, c net.Conn, src netip.AddrPort) {
	e.got <- nsAccepted{proxy: true, src: src}
	e.reply(c, "hello through the proxy")
}

func (e *nsHTTPEngine) reply(c net.Conn, body string) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	req.Body.Close()
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body)+1, body+"\n")
}

// findTestAssets finds the unpacked Debian kernel and static busybox the
// way the image package does: $VIBEDOM_ASSETS, else .cache/assets in the
// working directory or a parent.
func findTestAssets() (kernelDir, busybox string, ok bool) {
	var dirs []string
	if d := os.Getenv("VIBEDOM_ASSETS"); d != "" {
		dirs = append(dirs, d)
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			dirs = append(dirs, filepath.Join(d, ".cache", "assets"))
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	for _, d := range dirs {
		k, b := filepath.Join(d, "amd64", "kernel"), filepath.Join(d, "amd64", "busybox")
		ks, _ := filepath.Glob(filepath.Join(k, "boot", "vmlinuz-*"))
		if _, err := os.Stat(b); err == nil && len(ks) > 0 {
			return k, b, true
		}
	}
	return "", "", false
}

// netInitScript is the guest's PID 1. Each check prints "RESULT <step>
// <exit status>".
const netInitScript = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /etc /tmp /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net; do
	insmod /lib/modules/$m.ko 2>/dev/null
done
r() { step=$1; shift; "$@"; echo "RESULT $step $?"; }
# HTTP GET with nc: the static busybox's wget crashes without NSS files.
get() { printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' "$1" | nc -w 5 "$1" "${2:-80}"; }
has_addr() { ip -4 addr show eth0 | grep -q "inet 10.254.254.2/24"; }
has_route() { ip route | grep -q "default via 10.254.254.1"; }
resolved() { nslookup "$@" 2>&1 | tee /dev/stderr | grep -q "198\.18\."; }
allowed() { get api.example.com | grep -q "hello from api.example.com"; }
loopback() { ip route add 127.0.0.2/32 via 10.254.254.1 2>/dev/null; get 127.0.0.2; }
proxied() {
	printf 'GET http://api.example.com/ HTTP/1.0\r\nHost: api.example.com\r\n\r\n' |
		nc -w 5 10.254.254.1 3128 | grep -q "through the proxy"
}
ip link set lo up
ip link set eth0 up
r dhcp udhcpc -i eth0 -n -q -t 5 -T 2 -s /udhcpc.sh
ip -4 addr show eth0; ip route; cat /etc/resolv.conf
r address has_addr
r route has_route
r resolv grep -q "nameserver 10.254.254.1" /etc/resolv.conf
r ping-gateway ping -c 1 -W 3 10.254.254.1
r nslookup-allowed resolved api.example.com
r nslookup-denied resolved evil.example.net
r http-allowed allowed
r http-denied-port get api.example.com 8080
r http-ip get 93.184.216.34
r http-gateway get 10.254.254.1
r http-host-loopback loopback
r ping-outside ping -c 1 -W 2 8.8.8.8
r udp-outside-resolver resolved -timeout=2 api.example.com 8.8.8.8
r http-proxy proxied
# Root rewrites what it can: routes, resolv.conf, a new address.
ip route flush table main
ip route add default dev eth0
ip addr add 10.254.254.77/24 dev eth0
echo "nameserver 8.8.8.8" > /etc/resolv.conf
r tampered-nslookup-outside resolved -timeout=2 api.example.com
r tampered-http-ip get 93.184.216.34
echo "nameserver 10.254.254.1" > /etc/resolv.conf
r tampered-http-allowed allowed
echo "RESULT done 0"
poweroff -f
`

// udhcpcScript configures the NIC from the lease, as the guest agent will.
const udhcpcScript = `#!/bin/sh
case "$1" in
bound|renew)
	ip addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	[ -n "$router" ] && ip route add default via "$router" dev "$interface"
	: > /etc/resolv.conf
	for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf; done
	;;
esac
exit 0
`

// buildNetInitrd writes a newc cpio archive with busybox, the init
// scripts and the virtio-net modules.
func buildNetInitrd(path, kernelDir, busybox string) error {
	mods, err := filepath.Glob(filepath.Join(kernelDir, "lib", "modules", "*"))
	if err != nil || len(mods) == 0 {
		return fmt.Errorf("no modules under %s", kernelDir)
	}
	var w nsCpioWriter
	w.dir("bin")
	w.dir("lib")
	w.dir("lib/modules")
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	w.file("bin/busybox", 0o755, bb)
	w.file("init", 0o755, []byte(netInitScript))
	w.file("udhcpc.sh", 0o755, []byte(udhcpcScript))
	for _, m := range []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev",
		"virtio_pci", "failover", "net_failover", "virtio_net"} {
		var found string
		_ = filepath.WalkDir(mods[0], func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Name() == m+".ko" {
				found = p
				return io.EOF
			}
			return nil
		})
		if found == "" {
			return fmt.Errorf("module %s.ko not found under %s", m, mods[0])
		}
		b, err := os.ReadFile(found)
		if err != nil {
			return err
		}
		w.file("lib/modules/"+m+".ko", 0o644, b)
	}
	return os.WriteFile(path, w.finish(), 0o644)
}

// nsCpioWriter writes the newc format the kernel unpacks.
type nsCpioWriter struct {
	buf bytes.Buffer
	ino int
}

func (w *nsCpioWriter) entry(name string, mode uint32, data []byte) {
	w.ino++
	fmt.Fprintf(&w.buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		w.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	w.buf.WriteString(name)
	w.buf.WriteByte(0)
	w.pad()
	w.buf.Write(data)
	w.pad()
}

func (w *nsCpioWriter) pad() {
	for w.buf.Len()%4 != 0 {
		w.buf.WriteByte(0)
	}
}

func (w *nsCpioWriter) dir(name string)                         { w.entry(name, 0o40755, nil) }
func (w *nsCpioWriter) file(name string, perm uint32, b []byte) { w.entry(name, 0o100000|perm, b) }
func (w *nsCpioWriter) finish() []byte {
	w.entry("TRAILER!!!", 0, nil)
	return w.buf.Bytes()
}
