// Package proto is the contract between the host and vibedom-guest: the boot
// data the host hands the guest in the per-session initramfs, the paths the
// guest finds it at, and the names of the SSH requests beyond the standard
// ones. It is pure Go with no dependencies so both sides can import it.
//
// The boot data is trusted by the guest (it comes from the host); nothing the
// guest sends back is trusted by the host.
package proto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// Paths inside the guest's initramfs.
const (
	// BootConfigPath holds the JSON-encoded BootConfig.
	BootConfigPath = "/vibedom/boot.json"
	// HostKeyPath holds the guest's SSH host private key (OpenSSH PEM, 0600).
	HostKeyPath = "/vibedom/ssh_host_ed25519_key"
	// CACertPath holds the vibedom MITM CA certificate (PEM), when egress is
	// configured. Its key never enters the guest.
	CACertPath = "/vibedom/ca.pem"
	// ModuleListPath lists kernel modules to load, one path relative to
	// /lib/modules/<release>/ a line, in dependency order. Written by the
	// image builder into the base initramfs.
	ModuleListPath = "/etc/vibedom/modules.load"
	// GuestBinaryPath is where the guest agent binary is installed. /init is
	// a link to it.
	GuestBinaryPath = "/usr/bin/vibedom-guest"
)

// Mount points in the guest.
const (
	WorkspaceMount = "/mnt/workspace" // read-only host workspace
	ScratchMount   = "/mnt/scratch"   // the scratch disk's filesystem
	WorkDir        = "/work"          // OverlayFS the agent works in
	UpperDir       = ScratchMount + "/upper"
	OverlayWorkDir = ScratchMount + "/overlay-work"

	// The root image's overlay: the image read-only below, its upper layer
	// on the scratch disk, the merged root where user commands run.
	RootLower     = "/run/vibedom/lower"
	RootDir       = "/run/vibedom/root"
	RootUpperDir  = ScratchMount + "/root/upper"
	RootWorkDir   = ScratchMount + "/root/work"
	RootLabel     = "vibedom-root"
	RootAgentUser = "agent"
)

// Version is the boot data format version. The guest refuses other versions.
const Version = 1

// Control channel transports.
const (
	TransportVirtioSerial = "virtio-serial"
	TransportVsock        = "vsock"
)

// Workspace share filesystem types.
const (
	FS9P       = "9p"
	FSVirtiofs = "virtiofs"
)

// BootConfig is the per-session data the guest needs to set itself up.
type BootConfig struct {
	Version   int    `json:"version"`
	SessionID string `json:"session_id"`
	Hostname  string `json:"hostname"`

	Control   Control   `json:"control"`
	Workspace Workspace `json:"workspace"`
	Scratch   Scratch   `json:"scratch"`

	// AuthorizedKeys are public keys (authorized_keys format) allowed to log
	// in over the control channel. The host makes one per session.
	AuthorizedKeys []string `json:"authorized_keys"`

	// Env is added to the environment of every command and shell.
	Env map[string]string `json:"env,omitempty"`

	// Network configures the guest's NIC; nil means the guest has none.
	Network *Network `json:"network,omitempty"`

	// Root, when set, says a read-only root image is attached: user
	// commands run inside it (RunAsVar). nil: they run in the initramfs,
	// as root (the Debian test image).
	Root *Root `json:"root,omitempty"`

	// Layers are further read-only images mounted inside the root (an
	// agent's binaries), each found by its ext4 label. They need Root.
	Layers []Layer `json:"layers,omitempty"`

	// Debug makes the guest log more to the console.
	Debug bool `json:"debug,omitempty"`
}

// Root describes the root image: the guest finds the block device whose
// ext4 volume label is Label.
type Root struct {
	Label string `json:"label"`
}

// Layer is a read-only ext4 image mounted at Mount inside the root.
type Layer struct {
	Label string `json:"label"`
	Mount string `json:"mount"` // absolute, e.g. AgentMount
}

// AgentMount is where an agent's layer is mounted in the root.
const AgentMount = "/opt/vibedom/agent"

// RunAsVar, sent by the host as a command's environment variable (and
// removed before the command starts), says where a command runs:
// RunAsAgent (the image's unprivileged user) or RunAsRoot (root) inside the
// root image. Absent, or without a root image, the command runs as root in
// the initramfs: the control plane (collect, changes) runs there.
const (
	RunAsVar   = "VIBEDOM_RUN_AS"
	RunAsAgent = "agent"
	RunAsRoot  = "root"
)

// Control says where the guest's SSH server listens.
type Control struct {
	Transport string `json:"transport"`      // TransportVirtioSerial or TransportVsock
	Name      string `json:"name,omitempty"` // virtio-serial port name
	Port      uint32 `json:"port,omitempty"` // vsock port
}

// Workspace says how to mount the host workspace.
type Workspace struct {
	Tag    string `json:"tag"`
	FSType string `json:"fstype"` // FS9P or FSVirtiofs
}

// Scratch names the block device that holds the overlay's upper layer. The
// guest makes an ext4 filesystem on it if it has none, and keeps an existing
// one (so the upper dir survives a guest crash or a pause).
type Scratch struct {
	Device string `json:"device"` // e.g. "/dev/vda"
}

// Network configures the NIC. Addresses come from the host's DHCP server.
type Network struct {
	// Interface is the NIC name, normally "eth0".
	Interface string `json:"interface"`
	// ProxyURL, when set, is exported as HTTP_PROXY/HTTPS_PROXY (and lower
	// case) for tools that prefer an explicit proxy.
	ProxyURL string `json:"proxy_url,omitempty"`
	// NoProxy is exported as NO_PROXY.
	NoProxy string `json:"no_proxy,omitempty"`
}

// Validate checks the fields the guest cannot boot without.
func (c *BootConfig) Validate() error {
	if c.Version != Version {
		return fmt.Errorf("boot data version %d, this guest speaks %d", c.Version, Version)
	}
	switch c.Control.Transport {
	case TransportVirtioSerial:
		if c.Control.Name == "" {
			return fmt.Errorf("virtio-serial control channel without a port name")
		}
	case TransportVsock:
		if c.Control.Port == 0 {
			return fmt.Errorf("vsock control channel without a port")
		}
	default:
		return fmt.Errorf("unknown control transport %q", c.Control.Transport)
	}
	switch c.Workspace.FSType {
	case FS9P, FSVirtiofs:
	default:
		return fmt.Errorf("unknown workspace filesystem %q", c.Workspace.FSType)
	}
	if c.Workspace.Tag == "" {
		return fmt.Errorf("workspace share has no tag")
	}
	if c.Scratch.Device == "" {
		return fmt.Errorf("no scratch device")
	}
	if len(c.AuthorizedKeys) == 0 {
		return fmt.Errorf("no authorized keys")
	}
	return nil
}

// Marshal encodes c as indented JSON.
func (c *BootConfig) Marshal() ([]byte, error) { return json.MarshalIndent(c, "", "  ") }

// Parse decodes and validates boot data.
func Parse(data []byte) (*BootConfig, error) {
	var c BootConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("parse boot data: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("boot data: %w", err)
	}
	return &c, nil
}

// ReadyBanner is the line the guest writes on every new control connection
// before SSH starts; the host sends nothing until it has read it. On a
// virtio-serial port, bytes the host sends before the guest has opened the
// port can be lost, so the guest speaks first.
const ReadyBanner = "vibedom-guest ready\n"

// SSH requests and subsystems beyond the standard ones.
const (
	// RequestPoweroff is a global request: the guest replies, ends every
	// session, syncs, unmounts /work and the scratch disk, and powers off.
	RequestPoweroff = "poweroff@vibedom"
	// RequestSetTime is a global request whose payload is the host's wall
	// clock (an SSH uint64 of Unix nanoseconds): the guest sets its clock
	// to it. The host sends it after resuming a paused VM, whose clock
	// stood still while it was paused.
	RequestSetTime = "settime@vibedom"
	// RequestMemInfo is a global request the guest answers with its memory
	// as its kernel counts it (MemInfo, in the reply's payload). The host
	// steers the memory balloon by it.
	RequestMemInfo = "meminfo@vibedom"
	// RequestKeepalive is a global request the guest answers with success
	// (OpenSSH's name, so other SSH servers answer it too).
	RequestKeepalive = "keepalive@openssh.com"
	// SubsystemSFTP is the standard SFTP subsystem. Paths are absolute guest
	// paths; the server is not chrooted.
	SubsystemSFTP = "sftp"
	// ChangesCommand is the exec command line that prints the overlay's
	// change set as JSON (overlay.ChangeSet) on stdout. Sessions use
	// CollectCommand; this stays for tools and the collection benchmark.
	ChangesCommand = GuestBinaryPath + " changes"
	// CollectCommand is the exec command line that writes the collection
	// stream (see CollectMagic) on stdout: the change set, then the content
	// of every added or modified regular file. It takes one argument, the
	// largest file in bytes whose content is sent (larger ones are listed
	// only).
	CollectCommand = GuestBinaryPath + " collect"
)

// KeepVar, sent by the host as a shell or exec request's environment
// variable (with a pseudo-terminal, and removed before the command starts),
// names a kept terminal: the command runs on a terminal the guest agent
// owns, not the channel. The first request with a name starts the command;
// later ones attach to it (the command in them is ignored) and are first
// sent the terminal's recent output. Closing a channel detaches it and the
// command keeps running; when the command ends, every attached channel gets
// its exit status. Names are 1 to 32 of [a-z0-9-].
const KeepVar = "VIBEDOM_KEEP"

// ValidKeepName reports whether name can name a kept terminal.
func ValidKeepName(name string) bool {
	if name == "" || len(name) > 32 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// MemInfo is the guest's memory as /proc/meminfo has it, in bytes: the
// payload of the reply to RequestMemInfo, two big-endian uint64s.
type MemInfo struct {
	// Total is MemTotal: the RAM the kernel manages (less what the memory
	// balloon holds).
	Total uint64
	// Available is MemAvailable: what new work can have without the
	// guest swapping or killing.
	Available uint64
}

// Marshal encodes m as the reply's payload.
func (m MemInfo) Marshal() []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, m.Total)
	binary.BigEndian.PutUint64(b[8:], m.Available)
	return b
}

// ParseMemInfo decodes a reply's payload. It checks only the shape: the
// values are the guest's word.
func ParseMemInfo(b []byte) (MemInfo, error) {
	if len(b) != 16 {
		return MemInfo{}, errors.New("memory info: want 16 bytes")
	}
	return MemInfo{Total: binary.BigEndian.Uint64(b), Available: binary.BigEndian.Uint64(b[8:])}, nil
}
