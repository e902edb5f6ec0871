package guest

import (
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/guest/proto"
)

const testModuleList = `kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci.ko kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/block/virtio_blk.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/char/virtio_console.ko kernel/drivers/virtio/virtio.ko
kernel/net/core/failover.ko
kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko
kernel/drivers/net/virtio_net.ko kernel/drivers/virtio/virtio.ko kernel/drivers/net/net_failover.ko
kernel/fs/fuse/fuse.ko
kernel/fs/fuse/virtiofs.ko kernel/fs/fuse/fuse.ko kernel/drivers/virtio/virtio.ko
kernel/fs/overlayfs/overlay.ko
kernel/crypto/crc32c_generic.ko
kernel/fs/jbd2/jbd2.ko kernel/crypto/crc32c_generic.ko
kernel/fs/ext4/ext4.ko kernel/fs/jbd2/jbd2.ko kernel/crypto/crc32c_generic.ko
# a comment
kernel/net/9p/9pnet.ko
kernel/fs/9p/9p.ko kernel/net/9p/9pnet.ko
kernel/net/9p/9pnet_virtio.ko kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko
kernel/net/vmw_vsock/vsock.ko
kernel/drivers/virtio/virtio_mmio.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/acpi/button.ko
kernel/drivers/input/evdev.ko
kernel/drivers/virtio/virtio_balloon.ko kernel/drivers/virtio/virtio.ko
`

func names(ms []module) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.name())
	}
	return out
}

func TestSplitModules(t *testing.T) {
	list, err := parseModuleList(strings.NewReader(testModuleList))
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"virtio_ring", "virtio", "virtio_pci", "virtio_blk", "virtio_console"}
	fs := []string{"overlay", "crc32c_generic", "jbd2", "ext4"}
	tests := []struct {
		name       string
		bc         proto.BootConfig
		now, later []string
	}{
		{"virtiofs, no network", proto.BootConfig{Workspace: proto.Workspace{FSType: proto.FSVirtiofs}},
			slices.Concat(base, []string{"fuse", "virtiofs"}, fs, []string{"button", "evdev", "virtio_balloon"}),
			[]string{"virtio_mmio"}},
		{"9p with network", proto.BootConfig{Workspace: proto.Workspace{FSType: proto.FS9P}, Network: &proto.Network{}},
			slices.Concat(base, []string{"failover", "net_failover", "virtio_net"}, fs, []string{"9pnet", "9p", "9pnet_virtio", "button", "evdev", "virtio_balloon"}),
			[]string{"virtio_mmio"}},
		{"vsock control", proto.BootConfig{Control: proto.Control{Transport: proto.TransportVsock}, Workspace: proto.Workspace{FSType: proto.FSVirtiofs}},
			[]string{"virtio_ring", "virtio", "virtio_pci", "virtio_blk", "fuse", "virtiofs", "overlay", "crc32c_generic", "jbd2", "ext4", "vsock", "button", "evdev", "virtio_balloon"},
			[]string{"virtio_mmio"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now, later := splitModules(list, neededModules(&tt.bc))
			if got := names(now); !slices.Equal(got, tt.now) {
				t.Errorf("now:\n got %v\nwant %v", got, tt.now)
			}
			if got := names(later); !slices.Equal(got, tt.later) {
				t.Errorf("later:\n got %v\nwant %v", got, tt.later)
			}
		})
	}
}

// A list without dependencies (an image from before they were recorded)
// is loaded whole before the agent starts.
func TestSplitModulesWithoutDeps(t *testing.T) {
	list, err := parseModuleList(strings.NewReader("a.ko\nb.ko\nc.ko\n"))
	if err != nil {
		t.Fatal(err)
	}
	now, later := splitModules(list, []string{"b"})
	if len(now) != 3 || len(later) != 0 {
		t.Errorf("now %v, later %v", names(now), names(later))
	}
}
