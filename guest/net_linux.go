package guest

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vibedom/vibedom/guest/proto"
)

// udhcpcScript applies a busybox udhcpc lease: address, default route and
// resolver. It is what the host's DHCP server said, nothing more.
const udhcpcScript = `#!/bin/sh
case "$1" in
deconfig)
	ip -4 addr flush dev "$interface"
	ip link set "$interface" up
	;;
bound|renew)
	ip -4 addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	for r in $router; do ip route replace default via "$r" dev "$interface"; break; done
	: > /etc/resolv.conf
	for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf; done
	;;
esac
exit 0
`

// setupNetwork brings the NIC up by DHCP and installs the vibedom CA.
func setupNetwork(log *slog.Logger, n *proto.Network) error {
	iface := n.Interface
	if iface == "" {
		iface = "eth0"
	}
	if strings.ContainsAny(iface, "/ \t\n") {
		return fmt.Errorf("bad interface name %q", iface)
	}
	if err := waitFor("/sys/class/net/"+iface, 5*time.Second); err != nil {
		return fmt.Errorf("network interface: %w", err)
	}
	script := "/etc/vibedom/udhcpc.sh"
	if err := os.MkdirAll(filepath.Dir(script), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		return err
	}
	t := time.Now()
	// -q: quit once bound; -n: fail if no lease; -f: foreground; -t/-T:
	// 10 tries a second apart.
	if err := run(log, "udhcpc", "-i", iface, "-s", script, "-q", "-f", "-n", "-t", "10", "-T", "1"); err != nil {
		return fmt.Errorf("get an address by DHCP on %s: %w", iface, err)
	}
	log.Debug("network up", "took", time.Since(t).Round(time.Millisecond))
	return installCA()
}

// installCA appends the vibedom CA (from the boot data) to the system trust
// bundle.
func installCA() error {
	ca, err := os.ReadFile(proto.CACertPath)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("read the vibedom CA: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(CAPath), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(CAPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("install the vibedom CA: %w", err)
	}
	if _, err := f.Write(append([]byte("\n"), ca...)); err != nil {
		f.Close()
		return fmt.Errorf("install the vibedom CA: %w", err)
	}
	return f.Close()
}

// writeProfile writes /etc/profile.d/vibedom.sh and an /etc/profile that
// sources it.
func writeProfile(bc *proto.BootConfig) error {
	if err := os.MkdirAll("/etc/profile.d", 0o755); err != nil {
		return err
	}
	if err := os.WriteFile("/etc/profile.d/vibedom.sh", []byte(profileScript(SessionEnv(bc))), 0o644); err != nil {
		return err
	}
	if _, err := os.Stat("/etc/profile"); os.IsNotExist(err) {
		profile := "for f in /etc/profile.d/*.sh; do [ -r \"$f\" ] && . \"$f\"; done\nPS1='\\h:\\w\\$ '\ncd /work 2>/dev/null\n"
		if err := os.WriteFile("/etc/profile", []byte(profile), 0o644); err != nil {
			return err
		}
	}
	return nil
}
