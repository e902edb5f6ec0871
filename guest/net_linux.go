package guest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vibedom/vibedom/guest/proto"
)

// udhcpcScript applies a busybox udhcpc lease: address, MTU, default route
// and resolvers, exactly as the host's DHCP server said. RESOLV_CONF
// overrides /etc/resolv.conf (for tests).
const udhcpcScript = `#!/bin/sh
resolv="${RESOLV_CONF:-/etc/resolv.conf}"
case "$1" in
deconfig)
	ip -4 addr flush dev "$interface"
	ip link set dev "$interface" up
	;;
bound|renew)
	ip -4 addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	if [ -n "$mtu" ]; then ip link set dev "$interface" mtu "$mtu"; fi
	for r in $router; do ip route replace default via "$r" dev "$interface"; break; done
	: > "$resolv.tmp"
	for d in $dns; do echo "nameserver $d" >> "$resolv.tmp"; done
	mv -f "$resolv.tmp" "$resolv"
	;;
esac
exit 0
`

// udhcpcScriptPath is where the guest writes udhcpcScript.
const udhcpcScriptPath = "/etc/vibedom/udhcpc.sh"

// setupNetwork brings the NIC up by DHCP and installs the vibedom CA (when
// the boot data has one) into the system trust bundle.
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
	script := udhcpcScriptPath
	if err := os.MkdirAll(filepath.Dir(script), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		return err
	}
	// -q: quit once bound (the address is the guest's for the session);
	// -n: fail without a lease; -f: foreground; -t/-T: 10 tries a second
	// apart.
	if err := run(log, "udhcpc", "-i", iface, "-s", script, "-q", "-f", "-n", "-t", "10", "-T", "1"); err != nil {
		return fmt.Errorf("get an address by DHCP on %s (the host's network did not answer): %w", iface, err)
	}
	if err := installCA(proto.CACertPath, CAPath); err != nil {
		return fmt.Errorf("install the vibedom CA: %w", err)
	}
	return nil
}

// caBundle is the trust bundle the session environment points at: CAPath
// when the guest has a network and the boot data brought a CA, else "".
func caBundle(bc *proto.BootConfig) string {
	if bc.Network == nil {
		return ""
	}
	if _, err := os.Stat(proto.CACertPath); err != nil {
		return ""
	}
	return CAPath
}

// installCA appends the PEM certificates of src to the bundle dst (made if
// missing). A missing src is not an error: egress then has no CA.
func installCA(src, dst string) error {
	ca, err := os.ReadFile(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return fmt.Errorf("%s holds no PEM certificate", src)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if !bytes.HasSuffix(ca, []byte("\n")) {
		ca = append(ca, '\n')
	}
	if _, err := f.Write(append([]byte("\n"), ca...)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// defaultProfile is /etc/profile when the image has none: it reads
// /etc/profile.d and starts login shells in the work folder.
const defaultProfile = `for f in /etc/profile.d/*.sh; do [ -r "$f" ] && . "$f"; done
PS1='\h:\w\$ '
cd ` + proto.WorkDir + ` 2>/dev/null
`

// writeProfile writes etc/profile.d/vibedom.sh under root with env, and an
// etc/profile that reads it when there is none.
func writeProfile(root string, env []string) error {
	dir := filepath.Join(root, "etc", "profile.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "vibedom.sh"), []byte(profileScript(env)), 0o644); err != nil {
		return err
	}
	profile := filepath.Join(root, "etc", "profile")
	if _, err := os.Lstat(profile); errors.Is(err, fs.ErrNotExist) {
		return os.WriteFile(profile, []byte(defaultProfile), 0o644)
	}
	return nil
}
